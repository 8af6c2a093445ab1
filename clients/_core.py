"""The SDK's sans-I/O core: every decision the sync and async sessions share.

A session object is a thin I/O shell around :class:`SessionCore`. The core decides which hint
headers a completion call carries, which lifecycle request an action becomes, how a lifecycle
answer changes the session's state, and whether a failed call is retried; the shells only send
what it plans. This keeps one implementation of the behaviour for both sync and async code, in
the way h11/httpx split protocol from transport.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
import uuid
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tenure.clients.errors import TenureLifecycleError, TenureUsageError

__all__ = [
    "HEADER_EXPECTED_GAP_MS",
    "HEADER_LAST_TURN",
    "HEADER_PARENT",
    "HEADER_SEGMENT",
    "HEADER_SESSION",
    "Answer",
    "Exchange",
    "LifecycleRequest",
    "RetryPolicy",
    "SessionCore",
    "SessionState",
    "Sleep",
    "exchange",
    "lifecycle_base_url",
    "new_session_id",
]

HEADER_SESSION = "X-Tenure-Session"
HEADER_LAST_TURN = "X-Tenure-Last-Turn"
HEADER_EXPECTED_GAP_MS = "X-Tenure-Expected-Gap-Ms"
HEADER_SEGMENT = "X-Tenure-Segment"
HEADER_PARENT = "X-Tenure-Parent"

#: The SDK's own view of the session; the sidecar holds the authoritative one.
SessionState = Literal["open", "suspended", "finished"]

# Session ids travel in URL paths and headers, so keep them to a safe, bounded alphabet; the
# sidecar validates again, this check only turns a typo into an error before any request.
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")
# The sidecar's bound (30 days): anything longer is a unit mistake (ms passed as s), not a plan.
_MAX_GAP_S = 30 * 24 * 3600.0


def new_session_id() -> str:
    return f"s-{uuid.uuid4().hex}"


def _check_session_id(value: str, what: str) -> str:
    if not isinstance(value, str) or not _SESSION_ID.match(value):
        raise TenureUsageError(
            f"{what} must be 1-128 characters of letters, digits, '.', '_', ':' or '-', "
            f"starting with a letter or digit; got {value!r}"
        )
    return value


def _check_seconds(value: float | None, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TenureUsageError(f"{what} must be a number of seconds; got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or seconds > _MAX_GAP_S:
        raise TenureUsageError(f"{what} must be between 0 and {_MAX_GAP_S:.0f} s; got {value!r}")
    return seconds


def lifecycle_base_url(openai_base_url: object, *, anthropic: bool = False) -> str:
    """The URL that lifecycle paths hang off: the OpenAI client's ``base_url`` (ends in ``/v1``).

    The sidecar serves ``/v1/sessions/...`` beside ``/v1/chat/completions``, so the harness
    configures one URL and the SDK derives the rest. An Anthropic client's ``base_url`` is the
    server's root (it adds ``/v1/messages`` itself), so ``/v1`` is added here.
    """
    url = str(openai_base_url).rstrip("/")
    if anthropic and not url.endswith("/v1"):
        url += "/v1"
    return url


@dataclass(frozen=True, slots=True)
class LifecycleRequest:
    """One planned call to a lifecycle route; ``action`` names it for errors and state updates."""

    action: str
    method: Literal["GET", "POST"]
    path: str
    json: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry lifecycle calls the sidecar answered 503 (Redis down) or that never got through.

    The sidecar answers 503 with ``Retry-After`` while its Redis is away; a short bounded wait
    rides out a failover without turning a hint into a stalled agent.
    """

    attempts: int = 3
    base_delay_s: float = 0.1
    max_delay_s: float = 2.0

    def delay_s(self, attempt: int, status: int | None, headers: Mapping[str, str]) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or ``None`` to give up.

        ``status`` is ``None`` when the request failed to connect or timed out.
        """
        if attempt + 1 >= self.attempts:
            return None
        if status is not None and status not in (502, 503, 504):
            return None
        backoff: float = self.base_delay_s * (2.0**attempt)
        retry_after = _parse_retry_after(headers.get("retry-after"))
        if retry_after is not None:
            backoff = retry_after
        return min(backoff, self.max_delay_s)


def _parse_retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass(slots=True)
class SessionCore:
    """State and planning for one agent session (no I/O)."""

    session_id: str
    parent: str | None = None
    segment: str | None = None
    #: Default expected idle time after each turn, seconds (a per-call value overrides it).
    expected_gap_s: float | None = None
    role: str | None = None
    state: SessionState = "open"
    turns: int = 0
    #: Child sessions spawned from this one, by id.
    children: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check_session_id(self.session_id, "session_id")
        if self.parent is not None:
            _check_session_id(self.parent, "parent")
        self.expected_gap_s = _check_seconds(self.expected_gap_s, "expected_gap_s")

    # ---- completions -------------------------------------------------------------------------

    def hint_headers(
        self,
        *,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
    ) -> dict[str, str]:
        """The ``X-Tenure-*`` headers for this session's next call."""
        if self.state == "finished":
            raise TenureUsageError(f"session {self.session_id!r} has finished; start a new one")
        gap_s = _check_seconds(expected_gap_s, "expected_gap_s")
        if gap_s is None:
            gap_s = self.expected_gap_s
        headers: dict[str, str] = {HEADER_SESSION: self.session_id}
        if last_turn:
            headers[HEADER_LAST_TURN] = "true"
        elif gap_s is not None:
            # Integer milliseconds: the header's unit, and no float formatting surprises.
            headers[HEADER_EXPECTED_GAP_MS] = str(round(gap_s * 1000.0))
        chosen_segment = segment if segment is not None else self.segment
        if chosen_segment is not None:
            headers[HEADER_SEGMENT] = chosen_segment
        if self.parent is not None:
            headers[HEADER_PARENT] = self.parent
        return headers

    def completion_kwargs(
        self,
        kwargs: dict[str, Any],
        *,
        last_turn: bool,
        expected_gap_s: float | None,
        segment: str | None,
    ) -> dict[str, Any]:
        """The keyword arguments for ``client.<resource>.create``, hint headers merged in.

        Caller-supplied ``extra_headers`` are kept except ``X-Tenure-*`` ones: the session
        object is the one source of hints, so a header copied from an earlier call (say, a
        stale last-turn flag) cannot contradict it.
        """
        headers = self.hint_headers(
            last_turn=last_turn, expected_gap_s=expected_gap_s, segment=segment
        )
        merged = dict(kwargs)
        caller = merged.pop("extra_headers", None) or {}
        extra = {k: v for k, v in caller.items() if not k.lower().startswith("x-tenure-")}
        extra.update(headers)
        merged["extra_headers"] = extra
        return merged

    def completion_sent(self, *, last_turn: bool) -> None:
        """The sidecar accepted a completion request (its response, or stream, has begun)."""
        self.turns += 1
        # A request after suspension resumes the session on the sidecar as well.
        self.state = "finished" if last_turn else "open"

    # ---- lifecycle ----------------------------------------------------------------------------

    def _path(self, suffix: str = "") -> str:
        return f"/sessions/{self.session_id}{suffix}"

    def plan_suspend(self, reason: str | None, expected_wait_s: float | None) -> LifecycleRequest:
        self._require_live("suspend")
        body: dict[str, Any] = {}
        if reason is not None:
            body["reason"] = reason
        wait_s = _check_seconds(expected_wait_s, "expected_wait_s")
        if wait_s is not None:
            body["expected_wait_s"] = wait_s
        return LifecycleRequest("suspend", "POST", self._path("/suspend"), body)

    def plan_resume(self) -> LifecycleRequest:
        self._require_live("resume")
        return LifecycleRequest("resume", "POST", self._path("/resume"), {})

    def plan_end(self) -> LifecycleRequest:
        return LifecycleRequest("end", "POST", self._path("/end"), {})

    def plan_info(self) -> LifecycleRequest:
        return LifecycleRequest("info", "GET", self._path())

    def plan_spawn(
        self,
        worker_id: str | None,
        role: str,
        metadata: Mapping[str, Any] | None,
        ranker: Mapping[str, Any] | None = None,
    ) -> LifecycleRequest:
        self._require_live("spawn a worker from")
        worker = _check_session_id(worker_id or new_session_id(), "worker_id")
        body = {"worker_id": worker, "role": role, "metadata": dict(metadata or {})}
        # Spawn facts for the sidecar's worker ranker (segment tracking); only those given.
        body.update({k: v for k, v in (ranker or {}).items() if v is not None})
        return LifecycleRequest("spawn", "POST", self._path("/workers"), body)

    def plan_return(self) -> LifecycleRequest:
        """A spawned worker returns to its parent (its KV segments close in the engine)."""
        self._require_live("return")
        if self.parent is None:
            raise TenureUsageError(
                f"session {self.session_id!r} was not spawned; a lead session ends, it does "
                "not return"
            )
        return LifecycleRequest("return", "POST", self._path("/return"), {})

    def child_from(self, request: LifecycleRequest, answer: Mapping[str, Any]) -> SessionCore:
        """The child's core after the sidecar registered a spawn.

        The sidecar may rename the worker (e.g. scope it); its answer wins over what was asked.
        """
        assert request.json is not None
        child_id = answer.get("session_id") or request.json["worker_id"]
        self.children.append(str(child_id))
        return SessionCore(
            session_id=str(child_id),
            parent=self.session_id,
            segment=self.segment,
            expected_gap_s=self.expected_gap_s,
            role=str(request.json["role"]),
        )

    def lifecycle_done(self, request: LifecycleRequest) -> None:
        if request.action == "suspend":
            self.state = "suspended"
        elif request.action == "resume":
            self.state = "open"
        elif request.action in ("end", "return"):
            self.state = "finished"

    def should_end_on_exit(self) -> bool:
        # A declared last turn already finished the session on the sidecar; ending again
        # would only cost a round trip.
        return self.state != "finished"

    @staticmethod
    def ignorable_on_exit(error: TenureLifecycleError) -> bool:
        """An ``end`` on context exit that found no session has nothing left to reclaim.

        The sidecar creates a session at its first completion, so a block that exits before
        any call (or after the record expired) gets 404; that is not a failure of the block.
        """
        return error.status == 404

    def _require_live(self, verb: str) -> None:
        if self.state == "finished":
            raise TenureUsageError(f"cannot {verb} session {self.session_id!r}: it has finished")

    # ---- answers ------------------------------------------------------------------------------

    def check_answer(self, request: LifecycleRequest, status: int, body: bytes) -> dict[str, Any]:
        """Decode a lifecycle answer; raise :class:`TenureLifecycleError` for an error status."""
        payload = _decode_json(body)
        if status >= 400:
            raise TenureLifecycleError(
                action=request.action,
                session_id=self.session_id,
                status=status,
                detail=_error_detail(payload, body),
            )
        return payload if isinstance(payload, dict) else {"value": payload}

    def transport_error(self, request: LifecycleRequest, exc: Exception) -> TenureLifecycleError:
        return TenureLifecycleError(
            action=request.action,
            session_id=self.session_id,
            status=None,
            detail=f"{type(exc).__name__}: {exc}",
        )


def _decode_json(body: bytes) -> Any:
    if not body:
        return {}
    try:
        return json.loads(body)
    except ValueError:
        return None


def _error_detail(payload: Any, body: bytes) -> str:
    # The sidecar answers in the OpenAI error style ({"error": {"message": ...}}) or FastAPI's
    # ({"detail": ...}); show whichever is there, else a bounded slice of the raw body.
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "detail" in payload:
            return str(payload["detail"])
    return body[:300].decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Answer:
    """What the I/O shell got back for one sent request: a response, or the transport error."""

    status: int | None
    headers: Mapping[str, str]
    body: bytes
    error: Exception | None = None


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


#: A lifecycle exchange: yields the request to send (and receives its :class:`Answer`) or a
#: :class:`Sleep` (and receives ``None``); returns the decoded answer.
Exchange = Generator["LifecycleRequest | Sleep", "Answer | None", dict[str, Any]]


def exchange(core: SessionCore, request: LifecycleRequest, retry: RetryPolicy) -> Exchange:
    """Send ``request`` with retries, update ``core`` on success; the shells only drive this."""
    attempt = 0
    while True:
        answer = yield request
        assert answer is not None
        if answer.error is not None:
            delay = retry.delay_s(attempt, None, {})
            if delay is None:
                raise core.transport_error(request, answer.error) from answer.error
        else:
            assert answer.status is not None
            delay = retry.delay_s(attempt, answer.status, answer.headers)
            if answer.status < 500 or delay is None:
                payload = core.check_answer(request, answer.status, answer.body)
                core.lifecycle_done(request)
                return payload
        yield Sleep(delay)
        attempt += 1
