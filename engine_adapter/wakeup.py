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
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["find_engine_waker"]

_MAX_FRAMES = 64


def _waker(inbox: queue.Queue[Any], message: tuple[Any, None]) -> Callable[[], None]:
    def wake() -> None:
        inbox.put_nowait(message)

    return wake


def find_engine_waker() -> Callable[[], None] | None:
    try:
        from vllm.v1.engine import EngineCoreRequestType
    except ImportError:  # pragma: no cover - a vLLM without the request type
        return None
    frame: Any = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        inbox = getattr(owner, "input_queue", None)
        if isinstance(inbox, queue.Queue) and any(
            cls.__name__.startswith("EngineCore") for cls in type(owner).__mro__
        ):
            return _waker(inbox, (EngineCoreRequestType.WAKEUP, None))
        frame = frame.f_back
    return None
