"""``TenureSession``: an agent session on top of ``openai.OpenAI`` (the sync twin).

All behaviour lives in :mod:`clients._core`; this module only performs the I/O it plans.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, overload

import httpx
from openai import OpenAI, Stream
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from clients._core import (
    Answer,
    Exchange,
    LifecycleRequest,
    RetryPolicy,
    SessionCore,
    SessionState,
    Sleep,
    exchange,
    lifecycle_base_url,
    new_session_id,
)
from clients.errors import TenureLifecycleError

__all__ = ["TenureSession"]

_log = logging.getLogger("tenure.clients")
_DEFAULT_TIMEOUT = httpx.Timeout(10.0)


class TenureSession:
    """One agent session: completions carry its hints; lifecycle calls go to the sidecar.

    ``with TenureSession(client, session_id="task-42") as s:`` ends the session on
    exit (also when the body raises) unless a call declared ``last_turn=True``. Lifecycle calls
    reuse the OpenAI client's ``base_url`` and API key; pass ``api_key`` if the client gets its
    key from a provider callable.
    """

    def __init__(
        self,
        client: OpenAI,
        session_id: str | None = None,
        *,
        parent: str | None = None,
        segment: str | None = None,
        expected_gap_s: float | None = None,
        api_key: str | None = None,
        http_client: httpx.Client | None = None,
        retry: RetryPolicy | None = None,
        end_on_exit: bool = True,
        _core: SessionCore | None = None,
    ) -> None:
        self._core = _core or SessionCore(
            session_id=session_id or new_session_id(),
            parent=parent,
            segment=segment,
            expected_gap_s=expected_gap_s,
        )
        self._client = client
        self._base_url = lifecycle_base_url(client.base_url)
        self._api_key = api_key if api_key is not None else client.api_key
        self._auth = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=_DEFAULT_TIMEOUT)
        self._retry = retry or RetryPolicy()
        self._end_on_exit = end_on_exit

    def __repr__(self) -> str:
        # Never the API key: reprs end up in logs.
        return f"TenureSession(session_id={self.session_id!r}, state={self.state!r})"

    @property
    def session_id(self) -> str:
        return self._core.session_id

    @property
    def parent(self) -> str | None:
        return self._core.parent

    @property
    def state(self) -> SessionState:
        return self._core.state

    @property
    def turns(self) -> int:
        return self._core.turns

    # ---- completions -------------------------------------------------------------------------

    def hint_headers(
        self,
        *,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
    ) -> dict[str, str]:
        """This session's ``X-Tenure-*`` headers, for calls made outside the SDK.

        E.g. ``client.with_options(default_headers=s.hint_headers())`` for a framework that
        owns the OpenAI client. Such calls are not counted in :attr:`turns`.
        """
        return self._core.hint_headers(
            last_turn=last_turn, expected_gap_s=expected_gap_s, segment=segment
        )

    @overload
    def chat(
        self,
        *,
        stream: Literal[True],
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> Stream[ChatCompletionChunk]: ...

    @overload
    def chat(
        self,
        *,
        stream: Literal[False] = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> ChatCompletion: ...

    def chat(
        self,
        *,
        stream: bool = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> ChatCompletion | Stream[ChatCompletionChunk]:
        """``client.chat.completions.create(**kwargs)`` with this session's hints.

        ``last_turn=True`` declares the final turn (the sidecar reclaims the session's KV);
        ``expected_gap_s`` is the idle time expected before the next call (e.g. a tool's run).
        """
        call = self._core.completion_kwargs(
            kwargs, last_turn=last_turn, expected_gap_s=expected_gap_s, segment=segment
        )
        result: ChatCompletion | Stream[ChatCompletionChunk]
        result = self._client.chat.completions.create(stream=stream, **call)
        self._core.completion_sent(last_turn=last_turn)
        return result

    @overload
    def complete(
        self,
        *,
        stream: Literal[True],
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> Stream[Completion]: ...

    @overload
    def complete(
        self,
        *,
        stream: Literal[False] = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> Completion: ...

    def complete(
        self,
        *,
        stream: bool = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> Completion | Stream[Completion]:
        """``client.completions.create(**kwargs)`` (``/v1/completions``) with the hints."""
        call = self._core.completion_kwargs(
            kwargs, last_turn=last_turn, expected_gap_s=expected_gap_s, segment=segment
        )
        result: Completion | Stream[Completion]
        result = self._client.completions.create(stream=stream, **call)
        self._core.completion_sent(last_turn=last_turn)
        return result

    # ---- lifecycle ----------------------------------------------------------------------------

    def suspend(
        self, reason: str | None = None, expected_wait_s: float | None = None
    ) -> dict[str, Any]:
        """Declare a long wait (e.g. a human approval gate); the sidecar picks a host TTL."""
        return self._drive(self._core.plan_suspend(reason, expected_wait_s))

    def resume(self) -> dict[str, Any]:
        return self._drive(self._core.plan_resume())

    def end(self) -> dict[str, Any]:
        """Finish the session now; the sidecar reclaims its KV."""
        return self._drive(self._core.plan_end())

    def info(self) -> dict[str, Any]:
        """The sidecar's record of this session (``GET /v1/sessions/{id}``)."""
        return self._drive(self._core.plan_info())

    def spawn(
        self,
        worker_id: str | None = None,
        *,
        role: str = "worker",
        metadata: Mapping[str, Any] | None = None,
    ) -> TenureSession:
        """Register a sub-agent and return its session (``parent`` set to this one).

        The child shares this session's clients; use it as a context manager to end it.
        """
        request = self._core.plan_spawn(worker_id, role, metadata)
        answer = self._drive(request)
        return TenureSession(
            self._client,
            http_client=self._http,
            api_key=self._api_key,
            retry=self._retry,
            end_on_exit=self._end_on_exit,
            _core=self._core.child_from(request, answer),
        )

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> TenureSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._end_on_exit and self._core.should_end_on_exit():
                try:
                    self.end()
                except TenureLifecycleError as error:
                    if self._core.ignorable_on_exit(error):
                        return
                    if exc is None:
                        raise
                    # The body's own exception is the one the caller needs to see.
                    _log.warning("could not end session %s on exit", self.session_id, exc_info=True)
        finally:
            self.close()

    def _drive(self, request: LifecycleRequest) -> dict[str, Any]:
        steps: Exchange = exchange(self._core, request, self._retry)
        reply: Answer | None = None
        try:
            while True:
                step = steps.send(reply)
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                    reply = None
                else:
                    reply = self._send(step)
        except StopIteration as done:
            result: dict[str, Any] = done.value
            return result

    def _send(self, request: LifecycleRequest) -> Answer:
        try:
            response = self._http.request(
                request.method, self._base_url + request.path, json=request.json, headers=self._auth
            )
        except httpx.TransportError as exc:
            return Answer(status=None, headers={}, body=b"", error=exc)
        return Answer(status=response.status_code, headers=response.headers, body=response.content)
