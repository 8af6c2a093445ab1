"""Schemathesis over the whole OpenAPI schema: lifecycle, admin and the proxied routes.

The sidecar runs against a real Redis and the fake engine of ``fake_upstream`` (a network
boundary we do not own). Every generated request, valid and invalid, must get an answer the
schema declares: no 5xx, a declared status, a declared content type, a body that matches the
declared schema, declared headers.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.sidecar.conftest import LOADED_HOST, LOADED_HOST_TEST_TIMEOUT_S, LOADED_HOST_WAIT_S
from tests.sidecar.fake_upstream import FakeUpstream, ServerThread

ADMIN = {"Authorization": "Bearer test-admin-token"}
EXAMPLES_PER_OPERATION = 40
#: The acceptance floor for one run over the schema.
MIN_EXAMPLES = 1000
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


@pytest.fixture
def fuzzed(sidecar_factory, upstream):
    fake, _ = upstream
    # Models named "slow" would take seconds; generated names never hang the run.
    fake.slow_s = 0.01
    return sidecar_factory(**LOADED_HOST)


# Every operation keeps its 40 examples per mode (2,361 in all, over the 1,000 floor); on a
# busy host the run takes minutes, so its time limit is sized for that (a hang guard).
@pytest.mark.timeout(LOADED_HOST_TEST_TIMEOUT_S)
def test_lifecycle_and_admin_routes_never_5xx(fuzzed: ServerThread, upstream) -> None:
    """Now the full schema, proxy routes included: no 5xx and no schema violation."""
    fake: FakeUpstream = upstream[0]
    with httpx.Client(base_url=fuzzed.url, timeout=LOADED_HOST_WAIT_S) as http:
        # Some state to hit: an existing session, so generated ids sometimes find a record.
        http.post(
            "/v1/chat/completions",
            json={"model": "echo", "messages": [{"role": "user", "content": "x"}]},
            headers={"X-Tenure-Session": "a"},
        )
        raw = http.get("/openapi.json").json()
    schema = schemathesis.openapi.from_dict(raw)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    covered = {(op.method.upper(), op.path) for op in operations}
    assert {
        ("POST", "/v1/sessions/{session_id}/suspend"),
        ("PATCH", "/admin/config"),
        ("GET", "/v1/sessions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/v1/{path}"),
        ("POST", "/v1/{path}"),
        # Issue 23: the stored-response routes, with their ownership check.
        ("GET", "/v1/responses/{response_id}"),
        ("DELETE", "/v1/responses/{response_id}"),
        ("POST", "/v1/responses/{response_id}/cancel"),
        ("GET", "/v1/responses/{response_id}/input_items"),
    } <= covered

    failures: list[str] = []
    examples = 0
    with httpx.Client(base_url=fuzzed.url, timeout=LOADED_HOST_WAIT_S) as http:
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
                nonlocal examples
                examples += 1
                kwargs = case.as_transport_kwargs(base_url=fuzzed.url)
                # The admin token on every call (the tenant key is not needed: no tenants).
                headers = {**(kwargs.get("headers") or {}), **ADMIN}
                reply = http.request(
                    kwargs["method"],
                    kwargs["url"],
                    params=kwargs.get("params"),
                    headers=headers,
                    json=kwargs.get("json"),
                    content=kwargs.get("data") if "json" not in kwargs else None,
                )
                try:
                    case.validate_response(reply, checks=CHECKS)
                except (Exception, BaseExceptionGroup) as exc:  # a check failed: report all
                    failures.append(
                        f"{case.method} {case.formatted_path} -> {reply.status_code} "
                        f"{reply.text[:200]!r}: {str(exc)[:300]}"
                    )

            try:
                fuzz()
            except Unsatisfiable:
                # No invalid input exists for this operation (e.g. no parameters at all).
                assert mode == schemathesis.GenerationMode.NEGATIVE
    print(f"schemathesis: {examples} examples over {len(operations)} operations")
    assert failures == [], f"{len(failures)} of {examples}:\n" + "\n".join(failures[:20])
    assert examples >= MIN_EXAMPLES, examples
    # The proxied routes were really exercised through the fake engine.
    assert len(fake.received) > 100
