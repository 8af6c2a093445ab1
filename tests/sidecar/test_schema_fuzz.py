"""Schemathesis over the OpenAPI schema of the lifecycle and admin routes: never a 5xx."""

from __future__ import annotations

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

ADMIN = {"Authorization": "Bearer test-admin-token"}
EXAMPLES_PER_OPERATION = 25


def test_lifecycle_and_admin_routes_never_5xx(client, sidecar):
    # Some state to hit: an existing session, so generated ids sometimes find a record.
    client.post(
        "/v1/chat/completions",
        json={"model": "echo", "messages": [{"role": "user", "content": "x"}]},
        headers={"X-Tenure-Session": "a"},
    )
    raw = httpx.get(f"{sidecar.url}/openapi.json").json()
    schema = schemathesis.openapi.from_dict(raw)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    covered = {op.path for op in operations}
    assert {"/v1/sessions/{session_id}/suspend", "/admin/config", "/v1/sessions"} <= covered

    failures: list[str] = []
    with httpx.Client(base_url=sidecar.url, headers=ADMIN, timeout=10) as http:
        for operation, mode in (
            (op, mode)
            for op in operations
            for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
        ):

            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def fuzz(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
                kwargs = case.as_transport_kwargs(base_url=sidecar.url)
                reply = http.request(
                    kwargs["method"],
                    kwargs["url"],
                    params=kwargs.get("params"),
                    headers={**ADMIN, **(kwargs.get("headers") or {})},
                    json=kwargs.get("json"),
                    content=kwargs.get("data") if "json" not in kwargs else None,
                )
                if reply.status_code >= 500:
                    failures.append(
                        f"{case.method} {case.formatted_path} -> {reply.status_code}: "
                        f"{reply.text[:200]}"
                    )

            try:
                fuzz()
            except Unsatisfiable:
                # No invalid input exists for this operation (e.g. no parameters at all).
                assert mode == schemathesis.GenerationMode.NEGATIVE
    assert failures == []
