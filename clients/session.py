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

from clients._base import DEFAULT_TIMEOUT, SessionBase
from clients._core import (
    Answer,
    Exchange,
    LifecycleRequest,
    RetryPolicy,
    SessionCore,
    Sleep,
    exchange,
)
from clients.errors import TenureLifecycleError

__all__ = ["TenureSession"]

_log = logging.getLogger("tenure.clients")


class TenureSession(SessionBase[OpenAI, httpx.Client]):
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
        super().__init__(
            client,
            http_client or httpx.Client(timeout=DEFAULT_TIMEOUT),
            owns_http=http_client is None,
            session_id=session_id,
            parent=parent,
            segment=segment,
            expected_gap_s=expected_gap_s,
            api_key=api_key,
            retry=retry,
            end_on_exit=end_on_exit,
            core=_core,
        )

    # ---- completions -------------------------------------------------------------------------

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

    def return_to_parent(self) -> dict[str, Any]:
        """A spawned worker returns (``POST /v1/sessions/{id}/return``): finished, and with
        segment tracking on its KV segments close in the engine (SSD files deleted)."""
        return self._drive(self._core.plan_return())

    def info(self) -> dict[str, Any]:
        """The sidecar's record of this session (``GET /v1/sessions/{id}``)."""
        return self._drive(self._core.plan_info())

    def spawn(
        self,
        worker_id: str | None = None,
        *,
        role: str = "worker",
        metadata: Mapping[str, Any] | None = None,
        subagent_type: str | None = None,
        expected_tokens: int | None = None,
        model: str | None = None,
        background: bool | None = None,
    ) -> TenureSession:
        """Register a sub-agent and return its session (``parent`` set to this one).

        The child shares this session's clients; use it as a context manager to end it (for a
        worker, ending is its return). ``subagent_type``, ``expected_tokens``, ``model`` and
        ``background`` feed the sidecar's worker ranker when segment tracking is on.
        """
        ranker = {
            "subagent_type": subagent_type,
            "expected_tokens": expected_tokens,
            "model": model,
            "background": background,
        }
        request = self._core.plan_spawn(worker_id, role, metadata, ranker)
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
