"""The replay's engine model: continuous batching with chunked prefill, loads and store offers.

Decodes first, then prefill chunks in admission order up to ``max_num_batched_tokens``; time
advances span to span (a run of identical steps, cut short when the batch must change), at the
hardware roofline's step time. Admission is FCFS into the GPU prefix cache; host-tier hits are
loaded over one PCIe link before the request runs; computed prompt blocks are offered to the
host tier as vLLM's connector offers them (all-or-nothing, re-offered after a refusal).
"""

from __future__ import annotations

import math

from tenure.service.replay.model import slice_runs
from tenure.service.replay.requests import Request
from tenure.service.replay.sim_state import LOAD, STEP, SimState, Span

__all__ = ["Batching"]


class Batching:
    """Admission, loads, engine spans and store offers of one run.

    It admits from the shared queue (``sim.waiting``) when poked; :meth:`on_step` hands the
    requests a span finished back to the engine's loop, which completes them (the workload)
    and then calls :meth:`start_span`.
    """

    def __init__(self, sim: SimState) -> None:
        self.sim = sim
        self.loading = 0  # admitted requests whose host-tier load is in flight
        self.span: Span | None = None
        self.span_gen = 0  # bumped per span, so a truncated span's STEP event is ignored

    def poke(self, now: float) -> None:
        """Something joined the queue: end the current span at the next step boundary."""
        if self.span is None:
            self.start_span(now)
            return
        start, steps, dt, decodes, chunks = self.span
        done = max(1, math.ceil((now - start) / dt - 1e-9)) if dt > 0 else steps
        if done < steps:
            self.span = (start, done, dt, decodes, chunks)
            self.span_gen += 1
            self.sim.push(start + done * dt, STEP, self.span_gen)

    # --- admission and loads ------------------------------------------------------------------

    def admit(self, now: float) -> None:
        limit = self.sim.hw.max_num_seqs
        while self.sim.waiting and len(self.sim.running) + self.loading < limit:
            req = self.sim.waiting[0]
            g = self.sim.gpu.hit(req.runs)
            if not self.sim.gpu.admit(req.runs, req.extra_blocks):
                return  # FCFS: the head waits until it fits
            self.sim.waiting.popleft()
            req.gpu_hit = g
            req.lookup_s = now
            self.sim.tier.request_admitted(self.sim.trace.sessions[req.session].id, now)
            if self.sim.accesses is not None:
                self.sim.accesses.append(req)
            ssd_hit = 0
            if self.sim.lower is None:
                sid = self.sim.trace.sessions[req.session].id
                # Told to the policy even when the GPU holds it all: what a copy yielded.
                h = self.sim.tier.lookup(slice_runs(req.runs, g), session=sid, now=now)
            elif g >= req.n_blocks:
                h = 0
            else:
                sid = self.sim.trace.sessions[req.session].id
                h, ssd_hit = self.sim.lower.lookup(req.runs, g, sid, now)
                h += ssd_hit
            req.host_hit = h
            turn = self.sim.trace.sessions[req.session].turns[req.turn]
            cached = (g + h) * self.sim.bt
            if cached >= turn.input_tokens:
                cached = turn.input_tokens - 1  # vLLM recomputes the last prompt token
            req.computed = cached
            req.prefill_left = req.prefilled = turn.input_tokens - cached
            req.decode_left = max(turn.output_tokens, 1)
            req.offer_idx = req.access_start = g + h if h > 0 else 0
            if h > 0:
                nbytes = h * self.sim.block_bytes
                self.sim.result.host_bytes_loaded += nbytes
                if self.sim.lower is None:
                    start = max(now, self.sim.pcie_free_at)
                    self.sim.pcie_free_at = start + nbytes / self.sim.hw.load_bandwidth()
                    done = self.sim.pcie_free_at
                else:
                    done = self.sim.lower.load_done(now, h - ssd_hit, ssd_hit)
                self.loading += 1
                self.sim.push(done, LOAD, req)
            else:
                self.sim.running.append(req)

    def on_load(self, now: float, req: Request) -> None:
        self.loading -= 1
        self.sim.running.append(req)
        self.poke(now)

    # --- engine spans -------------------------------------------------------------------------

    def start_span(self, now: float) -> None:
        self.admit(now)
        if not self.sim.running:
            self.span = None
            return
        budget = self.sim.hw.max_num_batched_tokens
        decodes = [r for r in self.sim.running if r.prefill_left == 0]
        budget -= len(decodes)
        chunks: list[tuple[Request, int]] = []
        steps = math.inf
        for r in decodes:
            steps = min(steps, r.decode_left)
        for r in self.sim.running:
            if r.prefill_left > 0 and budget > 0:
                c = min(r.prefill_left, budget)
                budget -= c
                chunks.append((r, c))
                steps = min(steps, r.prefill_left // c)
        steps_i = max(1, int(steps))
        half = (steps_i - 1) / 2.0
        tokens = len(decodes)
        attn = 0.0
        kv = 0.0
        for r in decodes:
            turn = self.sim.trace.sessions[r.session].turns[r.turn]
            ctx = turn.input_tokens + (turn.output_tokens - r.decode_left) + half
            attn += ctx
            kv += ctx
        for r, c in chunks:
            pos = r.computed + c * half
            tokens += c
            attn += c * (pos + c / 2.0)
            kv += pos + c
        dt = self.sim.hw.step_seconds(tokens, attn, kv)
        self.span = (now, steps_i, dt, decodes, chunks)
        self.span_gen += 1
        self.sim.push(now + steps_i * dt, STEP, self.span_gen)

    def on_step(self, now: float, gen: int) -> list[Request] | None:
        """Advance the span that ends now; the requests it finished (``None``: superseded)."""
        if gen != self.span_gen or self.span is None:
            return None  # superseded by a truncation
        _start, steps, _dt, decodes, chunks = self.span
        self.span = None
        finished: list[Request] = []
        for r in decodes:
            r.decode_left -= steps
            if r.decode_left <= 0:
                finished.append(r)
        for r, c in chunks:
            r.prefill_left -= steps * c
            r.computed += steps * c
            if r.prefill_left <= 0:
                r.prefill_left = 0
                r.first_token = now
                r.decode_left -= 1  # the last prefill step samples the first token
                if r.decode_left <= 0:
                    finished.append(r)
        for r in self.sim.running:
            if r.offer_idx < r.n_blocks:
                self.offer(r, now)
        return finished

    def offer(self, req: Request, now: float) -> None:
        done = min(req.n_blocks, req.computed // self.sim.bt)
        if done <= req.offer_idx or done == req.refused_at:
            # vLLM re-offers a refused range every step; with nothing new computed the answer
            # cannot change (a gate keeps refusing the request, and an eviction policy only
            # refuses an offer larger than what it could ever free), so skip the repeat.
            return
        runs = slice_runs(req.runs, req.offer_idx, done)
        if self.sim.lower is not None:
            runs = self.sim.lower.filter_offer(runs)
        missing = self.sim.tier.missing(runs)
        sid = self.sim.trace.sessions[req.session].id
        res = self.sim.tier.store(runs, sid, now)
        if res.admitted:
            req.offer_idx = done
            req.inserted.extend(missing)
            self.sim.result.host_bytes_stored += res.stored_blocks * self.sim.block_bytes
            if self.sim.lower is not None:
                self.sim.lower.stored(missing, sid, now)
        else:
            req.refused_at = done
        self.sim.arm_timer(now)
