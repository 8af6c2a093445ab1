"""Waking an idle EngineCore from another thread, so pushed decisions and timers apply at once.

An idle EngineCore blocks on its input queue and re-checks ``has_pending_work`` only when
something arrives. vLLM wakes it the same way on shutdown: a ``WAKEUP`` request on that queue,
which the loop discards before it re-evaluates whether to step. The adapter's push thread does
exactly that when a decision arrives or a timer falls due; the work itself then runs on the
scheduler thread, in the step that follows, like every other policy call.

There is no public handle on the queue, so :func:`find_engine_waker` looks for the EngineCore
under construction in the caller's stack (the manager is built inside ``EngineCore.__init__``).
Not found (an in-process engine, another vLLM layout): ``None``, and work waits for the next
step instead.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

from tenure.engine_adapter.vllm_compat import engine_core_input_queue, wake_message

__all__ = ["find_engine_waker"]


def _waker(inbox: queue.Queue[Any], message: tuple[Any, None]) -> Callable[[], None]:
    def wake() -> None:
        inbox.put_nowait(message)

    return wake


def find_engine_waker() -> Callable[[], None] | None:
    message = wake_message()
    if message is None:
        return None
    # Skip this frame: the search starts at our caller (the manager's constructor).
    inbox = engine_core_input_queue(depth=1)
    return None if inbox is None else _waker(inbox, message)
