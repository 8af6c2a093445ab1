"""What the sync and async sessions share verbatim: state, identity, hint headers.

Everything here is free of I/O, so one class serves both twins; they add only the methods whose
I/O colour differs (``chat``, lifecycle calls, context management).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import httpx

from tenure.clients._core import (
    RetryPolicy,
    SessionCore,
    SessionState,
    lifecycle_base_url,
    new_session_id,
)

__all__ = ["DEFAULT_TIMEOUT", "SessionBase"]

DEFAULT_TIMEOUT = httpx.Timeout(10.0)

ClientT = TypeVar("ClientT")
HttpT = TypeVar("HttpT", httpx.Client, httpx.AsyncClient)


class SessionBase(Generic[ClientT, HttpT]):
    def __init__(
        self,
        client: ClientT,
        http: HttpT,
        *,
        owns_http: bool,
        session_id: str | None,
        parent: str | None,
        segment: str | None,
        expected_gap_s: float | None,
        api_key: str | None,
        retry: RetryPolicy | None,
        end_on_exit: bool,
        core: SessionCore | None,
    ) -> None:
        self._core = core or SessionCore(
            session_id=session_id or new_session_id(),
            parent=parent,
            segment=segment,
            expected_gap_s=expected_gap_s,
        )
        self._client = client
        base_url: Any = getattr(client, "base_url", "")
        #: An Anthropic client (``messages``, ``base_url`` without ``/v1``) or an OpenAI one.
        self._is_anthropic = hasattr(client, "messages") and not hasattr(client, "chat")
        self._base_url = lifecycle_base_url(base_url, anthropic=self._is_anthropic)
        self._api_key = api_key if api_key is not None else getattr(client, "api_key", None)
        self._auth = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._owns_http = owns_http
        self._http: HttpT = http
        self._retry = retry or RetryPolicy()
        self._end_on_exit = end_on_exit

    def __repr__(self) -> str:
        # Never the API key: reprs end up in logs.
        name = type(self).__name__
        return f"{name}(session_id={self.session_id!r}, state={self.state!r})"

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
