"""``AsyncTenureSession``: an agent session on ``openai.AsyncOpenAI`` or ``AsyncAnthropic``.

All behaviour lives in :mod:`tenure.clients._core`; this module only performs the I/O it plans.
This file is the one source of both twins: ``clients/session.py`` (the sync one) is generated
from it by ``scripts/gen_sync_session.py`` (unasync), and a test checks the two agree.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload

import httpx
from openai import AsyncOpenAI, AsyncStream
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent

from tenure.clients._base import DEFAULT_TIMEOUT, SessionBase
from tenure.clients._core import (
    Answer,
    Exchange,
    LifecycleRequest,
    RetryPolicy,
    SessionCore,
    Sleep,
    exchange,
)
from tenure.clients.errors import TenureLifecycleError, TenureUsageError

if TYPE_CHECKING:  # the anthropic client is optional (the ``clients`` extra installs it)
    from anthropic import AsyncAnthropic
    from anthropic import AsyncStream as AsyncAnthropicStream
    from anthropic.types import Message, RawMessageStreamEvent

__all__ = ["AsyncTenureSession"]

_log = logging.getLogger("tenure.clients")


# ``Any``: the client is one of two optional SDKs' (checked where it is used, _openai/_anthropic).
class AsyncTenureSession(SessionBase[Any, httpx.AsyncClient]):
    """One agent session: completions carry its hints; lifecycle calls go to the sidecar.

    ``async with AsyncTenureSession(client, session_id="task-42") as s:`` ends the session on
    exit (also when the body raises) unless a call declared ``last_turn=True``. ``client`` is
    an OpenAI client (``chat``, ``complete``, ``responses``) or an Anthropic one
    (``messages``). Lifecycle calls reuse the client's ``base_url`` and API key; pass
    ``api_key`` if the client gets its key from a provider callable.
    """

    def __init__(
        self,
        client: AsyncOpenAI | AsyncAnthropic,
        session_id: str | None = None,
        *,
        parent: str | None = None,
        segment: str | None = None,
        expected_gap_s: float | None = None,
        api_key: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        retry: RetryPolicy | None = None,
        end_on_exit: bool = True,
        _core: SessionCore | None = None,
    ) -> None:
        super().__init__(
            client,
            http_client or httpx.AsyncClient(timeout=DEFAULT_TIMEOUT),
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
    async def chat(
        self,
        *,
        stream: Literal[True],
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> AsyncStream[ChatCompletionChunk]: ...

    @overload
    async def chat(
        self,
        *,
        stream: Literal[False] = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> ChatCompletion: ...

    async def chat(
        self,
        *,
        stream: bool = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> ChatCompletion | AsyncStream[ChatCompletionChunk]:
        """``client.chat.completions.create(**kwargs)`` with this session's hints.

        ``last_turn=True`` declares the final turn (the sidecar reclaims the session's KV);
        ``expected_gap_s`` is the idle time expected before the next call (e.g. a tool's run).
        """
        call = self._core.completion_kwargs(
            kwargs, last_turn=last_turn, expected_gap_s=expected_gap_s, segment=segment
        )
        result: ChatCompletion | AsyncStream[ChatCompletionChunk]
        result = await self._openai("chat").chat.completions.create(stream=stream, **call)
        self._core.completion_sent(last_turn=last_turn)
        return result

    @overload
    async def complete(
        self,
        *,
        stream: Literal[True],
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> AsyncStream[Completion]: ...

    @overload
    async def complete(
        self,
        *,
        stream: Literal[False] = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> Completion: ...

    async def complete(
        self,
        *,
        stream: bool = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> Completion | AsyncStream[Completion]:
        """``client.completions.create(**kwargs)`` (``/v1/completions``) with the hints."""
        call = self._core.completion_kwargs(
            kwargs, last_turn=last_turn, expected_gap_s=expected_gap_s, segment=segment
        )
        result: Completion | AsyncStream[Completion]
        result = await self._openai("complete").completions.create(stream=stream, **call)
        self._core.completion_sent(last_turn=last_turn)
        return result

    @overload
    async def responses(
        self,
        *,
        stream: Literal[True],
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> AsyncStream[ResponseStreamEvent]: ...

    @overload
    async def responses(
        self,
        *,
        stream: Literal[False] = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> Response: ...

    async def responses(
        self,
        *,
        stream: bool = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> Response | AsyncStream[ResponseStreamEvent]:
        """``client.responses.create(**kwargs)`` (``/v1/responses``) with the hints."""
        call = self._core.completion_kwargs(
            kwargs, last_turn=last_turn, expected_gap_s=expected_gap_s, segment=segment
        )
        result: Response | AsyncStream[ResponseStreamEvent]
        result = await self._openai("responses").responses.create(stream=stream, **call)
        self._core.completion_sent(last_turn=last_turn)
        return result

    @overload
    async def messages(
        self,
        *,
        stream: Literal[True],
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> AsyncAnthropicStream[RawMessageStreamEvent]: ...

    @overload
    async def messages(
        self,
        *,
        stream: Literal[False] = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> Message: ...

    async def messages(
        self,
        *,
        stream: bool = False,
        last_turn: bool = False,
        expected_gap_s: float | None = None,
        segment: str | None = None,
        **kwargs: Any,
    ) -> Message | AsyncAnthropicStream[RawMessageStreamEvent]:
        """``client.messages.create(**kwargs)`` (Anthropic ``/v1/messages``) with the hints."""
        call = self._core.completion_kwargs(
            kwargs, last_turn=last_turn, expected_gap_s=expected_gap_s, segment=segment
        )
        result: Message | AsyncAnthropicStream[RawMessageStreamEvent]
        result = await self._anthropic().messages.create(stream=stream, **call)
        self._core.completion_sent(last_turn=last_turn)
        return result

    def _openai(self, verb: str) -> AsyncOpenAI:
        if self._is_anthropic:
            raise TenureUsageError(f"{verb}() needs an OpenAI client; use messages() here")
        client: AsyncOpenAI = self._client
        return client

    def _anthropic(self) -> AsyncAnthropic:
        if not self._is_anthropic:
            raise TenureUsageError("messages() needs an Anthropic client")
        client: AsyncAnthropic = self._client
        return client

    # ---- lifecycle ----------------------------------------------------------------------------

    async def suspend(
        self, reason: str | None = None, expected_wait_s: float | None = None
    ) -> dict[str, Any]:
        """Declare a long wait (e.g. a human approval gate); the sidecar picks a host TTL."""
        return await self._drive(self._core.plan_suspend(reason, expected_wait_s))

    async def resume(self) -> dict[str, Any]:
        return await self._drive(self._core.plan_resume())

    async def end(self) -> dict[str, Any]:
        """Finish the session now; the sidecar reclaims its KV."""
        return await self._drive(self._core.plan_end())

    async def return_to_parent(self) -> dict[str, Any]:
        """A spawned worker returns (``POST /v1/sessions/{id}/return``): finished, and with
        segment tracking on its KV segments close in the engine (SSD files deleted)."""
        return await self._drive(self._core.plan_return())

    async def info(self) -> dict[str, Any]:
        """The sidecar's record of this session (``GET /v1/sessions/{id}``)."""
        return await self._drive(self._core.plan_info())

    async def spawn(
        self,
        worker_id: str | None = None,
        *,
        role: str = "worker",
        metadata: Mapping[str, Any] | None = None,
        subagent_type: str | None = None,
        expected_tokens: int | None = None,
        model: str | None = None,
        background: bool | None = None,
    ) -> AsyncTenureSession:
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
        answer = await self._drive(request)
        return AsyncTenureSession(
            self._client,
            http_client=self._http,
            api_key=self._api_key,
            retry=self._retry,
            end_on_exit=self._end_on_exit,
            _core=self._core.child_from(request, answer),
        )

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncTenureSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._end_on_exit and self._core.should_end_on_exit():
                try:
                    await self.end()
                except TenureLifecycleError as error:
                    if self._core.ignorable_on_exit(error):
                        return
                    if exc is None:
                        raise
                    # The body's own exception is the one the caller needs to see.
                    _log.warning("could not end session %s on exit", self.session_id, exc_info=True)
        finally:
            await self.aclose()

    async def _drive(self, request: LifecycleRequest) -> dict[str, Any]:
        steps: Exchange = exchange(self._core, request, self._retry)
        reply: Answer | None = None
        try:
            while True:
                step = steps.send(reply)
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    reply = None
                else:
                    reply = await self._send(step)
        except StopIteration as done:
            result: dict[str, Any] = done.value
            return result

    async def _send(self, request: LifecycleRequest) -> Answer:
        try:
            response = await self._http.request(
                request.method, self._base_url + request.path, json=request.json, headers=self._auth
            )
        except httpx.TransportError as exc:
            return Answer(status=None, headers={}, body=b"", error=exc)
        return Answer(status=response.status_code, headers=response.headers, body=response.content)
