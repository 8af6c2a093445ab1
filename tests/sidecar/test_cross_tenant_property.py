"""Two tenants, random interleavings of every route, ids taken from the other tenant (issue 23).

Alpha and beta each start with sessions on every tracked route (chat, completions, Messages,
Responses with a stored response) and a suspended one. Hypothesis then draws sequences of
requests, each sent by one tenant with an id of the *other*: its session ids (bare, scoped
``other/id``, in every hint dialect, as a parent), its stored response ids (in every path form
and as ``previous_response_id`` / ``request_id``), on the proxied, stored-response and
lifecycle routes. After every request, what the other tenant owns must not have moved:

* its session records (``GET /v1/sessions`` and each record, as that tenant sees them);
* its decisions (the decision stream, filtered to its scoped ids);
* what the engine saw: no request sent by one tenant reaches the engine carrying the other
  tenant's scoped session id or one of its response ids (in the path or the body).

The sidecar runs with segments on, against a real Redis and the fake engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tenure.service.settings import TenantSpec
from tests.conftest import wait_for
from tests.sidecar.conftest import LOADED_HOST, LOADED_HOST_TEST_TIMEOUT_S, LOADED_HOST_WAIT_S

TENANTS = {"alpha": "key-alpha", "beta": "key-beta"}
ADMIN = {"Authorization": "Bearer test-admin-token"}
#: Sequences per run, and requests per sequence.
SEQUENCES = 40
STEPS = 8


@dataclass
class Owned:
    """What one tenant created in the set-up, by the ids another tenant could name."""

    sessions: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)


def _auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TENANTS[tenant]}"}


def _chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "echo", "messages": [{"role": "user", "content": "hi"}], **extra}


def _messages_body(**extra: Any) -> dict[str, Any]:
    return {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            **extra}  # fmt: skip


def _responses_body(**extra: Any) -> dict[str, Any]:
    return {"model": "echo", "input": "hi", **extra}


def _set_up(http: httpx.Client, tenant: str) -> Owned:
    owned = Owned()
    h = _auth(tenant)
    for route, body in (
        ("/v1/chat/completions", _chat_body()),
        ("/v1/completions", {"model": "echo", "prompt": "hi"}),
        ("/v1/messages", _messages_body()),
    ):
        session = f"{tenant}-{route.rsplit('/', 1)[1]}"
        reply = http.post(route, json=body, headers={**h, "X-Tenure-Session": session})
        assert reply.status_code == 200, reply.text
        owned.sessions.append(session)
    session = f"{tenant}-responses"
    reply = http.post(
        "/v1/responses", json=_responses_body(store=True),
        headers={**h, "X-Tenure-Session": session},
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    owned.sessions.append(session)
    owned.responses.append(reply.json()["id"])
    for session in owned.sessions:
        path = f"/v1/sessions/{session}"
        wait_for(lambda: http.get(path, headers=h).status_code == 200, LOADED_HOST_WAIT_S)  # noqa: B023
    suspended = owned.sessions[0]
    wait_for(
        lambda: http.get(f"/v1/sessions/{suspended}", headers=h).json().get("state") == "idle",
        LOADED_HOST_WAIT_S,
    )
    assert (
        http.post(
            f"/v1/sessions/{suspended}/suspend", json={"expected_wait_s": 600}, headers=h
        ).status_code
        == 200
    )
    return owned


def _snapshot(http: httpx.Client, tenant: str) -> dict[str, Any]:
    """What ``tenant`` owns, as it (and the admin) can read it, without touching the engine."""
    h = _auth(tenant)
    listing = http.get("/v1/sessions?limit=500", headers=h).json()
    records = {}
    for row in listing["sessions"]:
        session = row["session_id"]
        record = http.get(f"/v1/sessions/{session}", headers=h).json()
        record.pop("eviction_class", None)  # a function of the clock, not of the state
        records[session] = record
    decisions = [
        d
        for d in http.get("/admin/decisions?limit=1000", headers=ADMIN).json()["decisions"]
        if str(d.get("session_id", "")).startswith(f"{tenant}/")
    ]
    return {"records": records, "decisions": decisions}


def _engine_ids(body: Any) -> set[str]:
    """The ids an engine acts on: the session and parent of the sidecar's own tags
    (``kv_transfer_params.tenure``, tenant-scoped) and the response ids a Responses request
    names (vLLM keys its response store by ``request_id`` and chains on
    ``previous_response_id``). Other stacks' dialect fields (``agent_hint``, ...) are
    forwarded as the client wrote them, by design (``tenure.service.api.dialects``): the client's
    own text, not an id the sidecar vouches for."""
    found: set[str] = set()
    if not isinstance(body, dict):
        return found
    for key in ("previous_response_id", "request_id"):
        if isinstance(body.get(key), str):
            found.add(body[key])
    kv = body.get("kv_transfer_params")
    tags = kv.get("tenure") if isinstance(kv, dict) else None
    if isinstance(tags, dict):
        found |= {str(tags[k]) for k in ("session_id", "parent") if k in tags}
    return found


# --- the adversary's moves -------------------------------------------------------------------


def _session_forms(other: str, session: str) -> st.SearchStrategy[str]:
    return st.sampled_from([session, f"{other}/{session}", f"{other}%2F{session}"])


@st.composite
def _move(draw: st.DrawFn, owned: dict[str, Owned]) -> tuple[str, str, str, dict[str, Any]]:
    """``(actor, method, path, request kwargs)``: one request by ``actor`` naming an id of the
    other tenant."""
    actor = draw(st.sampled_from(sorted(TENANTS)))
    other = "beta" if actor == "alpha" else "alpha"
    session = draw(st.sampled_from(owned[other].sessions))
    response = draw(st.sampled_from(owned[other].responses))
    named = draw(_session_forms(other, session))
    headers = _auth(actor)
    kind = draw(
        st.sampled_from(
            ["chat", "completions", "messages", "count_tokens", "responses", "stored", "lifecycle",
             "listing"]
        )
    )  # fmt: skip
    dialects: list[tuple[dict[str, str], dict[str, Any]]] = [
        ({"X-Tenure-Session": named}, {}),
        ({"X-Session-Token": named}, {}),
        ({"X-Dynamo-Session-ID": named}, {}),
        ({}, {"prompt_cache_key": named}),
        ({}, {"agent_hint": {"session_id": named}}),
        ({"X-Tenure-Session": f"{actor}-own", "X-Tenure-Parent": named}, {}),
        ({}, {"kv_transfer_params": {"tenure": {"session_id": f"{other}/{session}"}}}),
    ]
    dialect = draw(st.sampled_from(dialects))
    hint_headers, hint_body = dialect
    if kind == "chat":
        return actor, "POST", "/v1/chat/completions", {
            "headers": {**headers, **hint_headers}, "json": _chat_body(**hint_body)}  # fmt: skip
    if kind == "completions":
        body = {"model": "echo", "prompt": "hi", **hint_body}
        return actor, "POST", "/v1/completions", {
            "headers": {**headers, **hint_headers}, "json": body}  # fmt: skip
    if kind == "messages":
        body = _messages_body(**hint_body)
        return actor, "POST", "/v1/messages", {"headers": {**headers, **hint_headers}, "json": body}
    if kind == "count_tokens":
        return actor, "POST", "/v1/messages/count_tokens", {
            "headers": {**headers, **hint_headers}, "json": _messages_body()}  # fmt: skip
    if kind == "responses":
        extras: list[dict[str, Any]] = [
            {"previous_response_id": response}, {"request_id": response},
            {"previous_response_id": response, "store": True}, {},
        ]  # fmt: skip
        extra = draw(st.sampled_from(extras))
        return (
            actor,
            "POST",
            "/v1/responses",
            {"headers": {**headers, **hint_headers}, "json": _responses_body(**hint_body, **extra)},
        )
    if kind == "stored":
        method, tail = draw(
            st.sampled_from([("GET", ""), ("DELETE", ""), ("POST", "/cancel"),
                             ("GET", "/input_items")])
        )  # fmt: skip
        path = draw(
            st.sampled_from(
                [f"/v1/responses/{response}{tail}", f"/v1/responses/{response}{tail}/",
                 f"/v1//responses/{response}{tail}", f"/v1/responses//{response}{tail}"]
            )
        )  # fmt: skip
        return actor, method, path, {"headers": headers}
    if kind == "lifecycle":
        verb = draw(st.sampled_from(["suspend", "resume", "end", "return", "workers", ""]))
        if verb == "":
            return actor, "GET", f"/v1/sessions/{named}", {"headers": headers}
        request: dict[str, Any] = {"expected_wait_s": 5} if verb == "suspend" else {}
        if verb == "workers":
            request = {"workers": [{"session_id": f"{actor}-w"}]}
        return actor, "POST", f"/v1/sessions/{named}/{verb}", {"headers": headers, "json": request}
    return actor, "GET", "/v1/sessions", {"headers": headers}


@pytest.fixture
def two_tenants(sidecar_factory, upstream):
    fake, _ = upstream
    server = sidecar_factory(
        tenants={key: TenantSpec(name=name) for name, key in TENANTS.items()},
        segments=True,
        **LOADED_HOST,
    )
    return server, fake


@pytest.mark.timeout(LOADED_HOST_TEST_TIMEOUT_S)
def test_no_request_of_one_tenant_moves_the_others_state(two_tenants) -> None:
    server, fake = two_tenants
    failures: list[str] = []
    with httpx.Client(base_url=server.url, timeout=LOADED_HOST_WAIT_S) as http:
        owned = {tenant: _set_up(http, tenant) for tenant in TENANTS}

        @settings(
            max_examples=SEQUENCES, deadline=None, database=None,
            suppress_health_check=list(HealthCheck),
        )  # fmt: skip
        @given(moves=st.lists(_move(owned), min_size=1, max_size=STEPS))
        def adversary(moves: list[tuple[str, str, str, dict[str, Any]]]) -> None:
            for actor, method, path, kwargs in moves:
                other = "beta" if actor == "alpha" else "alpha"
                before = _snapshot(http, other)
                seen = len(fake.received)
                reply = http.request(method, path, **kwargs)
                where = f"{actor}: {method} {path} {kwargs.get('json')} -> {reply.status_code}"
                if reply.status_code >= 500:
                    failures.append(f"{where}: a 5xx {reply.text[:200]}")
                # Reading a record waits for that session's pending end-of-turn write, so a
                # late write into the other tenant's session is seen here too.
                after = _snapshot(http, other)
                if after != before:
                    failures.append(f"{where}: moved {other}'s state: {before} -> {after}")
                for request in fake.received[seen:]:
                    ids = _engine_ids(request.body) | {request.path}
                    theirs = {i for i in ids if i.startswith(f"{other}/")} | {
                        i for i in ids for r in owned[other].responses if r in i
                    }
                    if theirs:
                        failures.append(f"{where}: the engine saw {other}'s ids {sorted(theirs)}")
                assert not failures, "\n".join(failures[:10])

        adversary()
    assert not failures, "\n".join(failures[:10])
