"""A randomised stand-in for vLLM's offloading scheduler, driving real offloading managers.

It makes the calls ``OffloadingConnectorScheduler`` makes (``on_new_request``, ``lookup`` of the
prefix, ``prepare_load`` / ``complete_load``, ``prepare_store`` of the newly computed chunks in
one or more offers, ``complete_store`` with success or failure, ``on_request_finished``,
``on_schedule_end``) plus the ones only other callers make (``touch``, ``reset_cache``), with
requests interleaved and transfers completing late, so chunks are pinned or pending while
other requests store. Agent-like contexts: sessions that share a system prompt, grow a few
blocks a turn, sometimes edit their context (a new key chain from some block on, once or twice
in one request), end with a declared last turn, or run untagged.

A :class:`Target` is where the calls go: one manager (:class:`One`), or a vLLM reference and
the manager under test in lockstep (:class:`Lockstep`, the differential test), each with its own
``ReqContext`` per request because managers keep per-request state in it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadKey
else:
    OffloadKey = bytes

BLOCK = 16
SYSTEM_BLOCKS = 2


def key(serial: int, group: int = 0) -> OffloadKey:
    """A 32-byte block hash + 4-byte KV group index, as vLLM's ``OffloadKey``."""
    return OffloadKey(serial.to_bytes(32, "big") + group.to_bytes(4, "big"))


class One:
    """Calls go to one manager."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def new_ctx(self, req_id: str, params: dict[str, Any] | None) -> Any:
        from vllm.v1.kv_offload.base import ReqContext

        return ReqContext(req_id=req_id, kv_transfer_params=params)

    def position(self, ctx: Any, k: OffloadKey, end_token: int) -> None:
        ctx.set_offload_key_position(k, end_token)

    def call(self, name: str, *args: Any) -> Any:
        return getattr(self.manager, name)(*args)


class Lockstep:
    """Calls go to ``reference`` and ``subject``; ``check(name, theirs, ours)`` compares."""

    def __init__(
        self, reference: Any, subject: Any, check: Callable[[str, Any, Any], None]
    ) -> None:
        self.reference = One(reference)
        self.subject = One(subject)
        self.check = check

    def new_ctx(self, req_id: str, params: dict[str, Any] | None) -> Any:
        return (self.reference.new_ctx(req_id, params), self.subject.new_ctx(req_id, params))

    def position(self, ctx: Any, k: OffloadKey, end_token: int) -> None:
        ctx[0].set_offload_key_position(k, end_token)
        ctx[1].set_offload_key_position(k, end_token)

    def call(self, name: str, *args: Any) -> Any:
        def pick(i: int) -> list[Any]:
            return [a[i] if isinstance(a, tuple) else a for a in args]

        theirs = self.reference.call(name, *pick(0))
        ours = self.subject.call(name, *pick(1))
        self.check(name, theirs, ours)
        return theirs


@dataclass
class _Request:
    req_id: str
    ctx: Any
    blocks: list[int]  # block serials; a block has one key per KV group
    slot: str  # the session slot (its tag, when tagged)
    last: bool
    stage: str = "lookup"  # lookup -> store -> finish
    next_store: int = 0
    offers: int = 1
    loads: list[list[OffloadKey]] = field(default_factory=list)
    stores: list[list[OffloadKey]] = field(default_factory=list)


@dataclass
class Mix:
    """Probabilities of the rarer events (per step unless noted)."""

    untagged: float = 0.15  # per request
    last_turn: float = 0.15  # per request
    edit: float = 0.12  # per request: rewrite the context from some block on
    second_edit: float = 0.3  # per edit: a second rewrite later in the same request
    store_fails: float = 0.05  # per completed store
    late_transfer: float = 0.35  # per transfer: completes a few steps later
    touch: float = 0.03
    reset: float = 0.004
    new_request: float = 0.3


class Driver:
    """Random scheduler traffic against ``target``; ``after(name)`` runs after each call."""

    def __init__(
        self,
        target: Any,
        rng: random.Random,
        *,
        sessions: int = 6,
        max_context: int = 24,
        mix: Mix | None = None,
        after: Callable[[str], None] | None = None,
        shared_prefix: bool = True,
        touchable: Callable[[OffloadKey], bool] | None = None,
        groups: int = 1,
    ) -> None:
        self.t = target
        self.rng = rng
        self.mix = mix or Mix()
        self.after = after
        self.max_context = max_context
        self._serial = 0
        self._requests = 0
        self.shared_prefix = shared_prefix
        self.touchable = touchable
        self.groups = groups
        self.system = [self._new_block() for _ in range(SYSTEM_BLOCKS)]
        self.contexts = {f"s{i}": self._fresh_context() for i in range(sessions)}
        #: A slot's conversations: a new session id after each declared last turn.
        self.generation = dict.fromkeys(self.contexts, 0)
        self.active: dict[str, _Request] = {}
        self.pending_loads: list[tuple[Any, list[OffloadKey]]] = []
        self.pending_stores: list[tuple[Any, list[OffloadKey]]] = []
        self.held: list[OffloadKey] = []  # keys some store reported (for touch)
        self.counts: dict[str, int] = {}

    def _fresh_context(self) -> list[int]:
        if self.shared_prefix:
            return list(self.system)
        return [self._new_block() for _ in range(SYSTEM_BLOCKS)]

    def _new_block(self) -> int:
        self._serial += 1
        return self._serial

    def keys(self, blocks: list[int]) -> list[OffloadKey]:
        """The blocks' keys as the scheduler offers them: group by group, in prefix order."""
        return [key(b, g) for g in range(self.groups) for b in blocks]

    def _position(self, ctx: Any, blocks: list[int], start: int = 0) -> None:
        for i in range(start, len(blocks)):
            for g in range(self.groups):
                self.t.position(ctx, key(blocks[i], g), (i + 1) * BLOCK)

    def _call(self, name: str, *args: Any) -> Any:
        self.counts[name] = self.counts.get(name, 0) + 1
        out = self.t.call(name, *args)
        if self.after is not None:
            self.after(name)
        return out

    # --- one step ---------------------------------------------------------------------------

    def step(self) -> None:
        rng, mix = self.rng, self.mix
        roll = rng.random()
        if roll < mix.reset:
            self._reset()
        elif roll < mix.reset + mix.touch and self.held:
            sample = rng.sample(self.held, min(len(self.held), rng.randint(1, 4)))
            if self.touchable is not None:
                sample = [k for k in sample if self.touchable(k)]
            if sample:
                self._call("touch", sample, self.t.new_ctx("touch", None))
        elif self.pending_loads and rng.random() < 0.3:
            ctx, keys = self.pending_loads.pop(rng.randrange(len(self.pending_loads)))
            self._call("complete_load", keys, ctx)
        elif self.pending_stores and rng.random() < 0.3:
            ctx, keys = self.pending_stores.pop(rng.randrange(len(self.pending_stores)))
            self._complete_store(ctx, keys)
        elif not self.active or rng.random() < mix.new_request:
            idle = [s for s in self.contexts if s not in self.active]
            if idle:
                self._start(rng.choice(idle))
        else:
            self._advance(self.active[rng.choice(list(self.active))])
        if rng.random() < 0.2:
            from vllm.v1.kv_offload.base import ScheduleEndContext

            self._call("on_schedule_end", ScheduleEndContext((), ()))

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    # --- requests -----------------------------------------------------------------------------

    def _start(self, session: str) -> None:
        rng, mix = self.rng, self.mix
        self._requests += 1
        blocks = list(self.contexts[session])
        if len(blocks) > SYSTEM_BLOCKS + 1 and rng.random() < mix.edit:
            # An edited context: the chain diverges from some block on.
            cut = rng.randrange(SYSTEM_BLOCKS, len(blocks))
            blocks = blocks[:cut] + [self._new_block() for _ in range(len(blocks) - cut)]
        blocks += [self._new_block() for _ in range(rng.randint(1, 4))]
        blocks = blocks[: self.max_context]
        last = rng.random() < mix.last_turn or len(blocks) >= self.max_context
        tagged = rng.random() >= mix.untagged
        params: dict[str, Any] | None = None
        if tagged:
            tags: dict[str, Any] = {
                "session_id": f"{session}.{self.generation[session]}",
                "expected_gap_ms": rng.choice([500, 5_000, 60_000, 600_000]),
            }
            if last:
                tags["last_turn"] = True
            params = {"tenure": tags}
        ctx = self.t.new_ctx(f"r{self._requests}", params)
        self._call("on_new_request", ctx)
        self._position(ctx, blocks)  # vLLM hashes the request's blocks after on_new_request
        request = _Request(
            f"r{self._requests}", ctx, blocks, session, last, offers=rng.randint(1, 3)
        )
        self.active[session] = request
        self.contexts[session] = blocks

    def _advance(self, r: _Request) -> None:
        rng = self.rng
        if r.stage == "lookup":
            hit = 0
            for b in r.blocks:
                if any(
                    self._call("lookup", key(b, g), r.ctx).name != "HIT" for g in range(self.groups)
                ):
                    break
                hit += 1
            if hit:
                loaded = self.keys(r.blocks[:hit])
                self._call("prepare_load", loaded, r.ctx)
                if rng.random() < self.mix.late_transfer:
                    self.pending_loads.append((r.ctx, loaded))
                else:
                    self._call("complete_load", loaded, r.ctx)
            r.next_store = hit
            r.stage = "store"
        elif r.stage == "store":
            remaining = len(r.blocks) - r.next_store
            if remaining <= 0 or r.offers <= 0:
                r.stage = "finish"
                return
            n = remaining if r.offers == 1 else rng.randint(1, remaining)
            first = r.next_store - 1 if r.next_store and rng.random() < 0.3 else r.next_store
            offer = self.keys(r.blocks[first : r.next_store + n])  # maybe a stored block too
            if rng.random() < self.mix.second_edit * self.mix.edit and r.next_store + n < len(
                r.blocks
            ):
                # A second edit inside this request: the rest of its chain changes now.
                cut = r.next_store + n
                r.blocks[cut:] = [self._new_block() for _ in range(len(r.blocks) - cut)]
                self._position(r.ctx, r.blocks, cut)
                self.contexts[r.slot] = r.blocks
            out = self._call("prepare_store", offer, r.ctx)
            r.offers -= 1
            if out is not None:
                stored = list(out.keys_to_store)
                if stored:
                    if rng.random() < self.mix.late_transfer:
                        self.pending_stores.append((r.ctx, stored))
                    else:
                        self._complete_store(r.ctx, stored)
                r.next_store += n
            elif rng.random() < 0.5:
                r.offers += 1  # retried at a later step, as the scheduler does
        else:
            self._call("on_request_finished", r.ctx)
            del self.active[r.slot]
            if r.last:
                self.contexts[r.slot] = self._fresh_context()
                self.generation[r.slot] += 1

    def _complete_store(self, ctx: Any, keys: list[OffloadKey]) -> None:
        ok = self.rng.random() >= self.mix.store_fails
        self._call("complete_store", keys, ctx, ok)
        if ok:
            self.held.extend(keys)
            if len(self.held) > 256:
                del self.held[:128]

    def _reset(self) -> None:
        # vLLM's reset keeps running requests (they re-offload from chunk 0) and guarantees
        # that transfers issued before it never complete.
        self._call("reset_cache")
        self.pending_loads.clear()
        self.pending_stores.clear()
        self.held.clear()
        for r in self.active.values():
            if r.stage != "lookup":
                r.stage, r.next_store, r.offers = "store", 0, max(r.offers, 1)

    def drain(self) -> None:
        """Complete every transfer and finish every request."""
        while self.pending_loads:
            ctx, keys = self.pending_loads.pop()
            self._call("complete_load", keys, ctx)
        while self.pending_stores:
            ctx, keys = self.pending_stores.pop()
            self._complete_store(ctx, keys)
        for r in list(self.active.values()):
            while r.slot in self.active:
                self._advance(r)
                while self.pending_stores:
                    ctx, keys = self.pending_stores.pop()
                    self._complete_store(ctx, keys)
                while self.pending_loads:
                    ctx, keys = self.pending_loads.pop()
                    self._call("complete_load", keys, ctx)
