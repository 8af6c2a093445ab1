"""The replay's in-flight records: a request (one turn) and a parent turn's join on sub-agents."""

from __future__ import annotations

from dataclasses import dataclass

from tenure.service.policy.types import Run

__all__ = ["Join", "Request"]


class Request:
    """One turn in flight: its prompt runs, what is cached, computed and still to decode."""

    __slots__ = (
        "access_start",
        "arrival",
        "computed",
        "decode_left",
        "done_s",
        "extra_blocks",
        "first_token",
        "gpu_hit",
        "host_hit",
        "inserted",
        "lookup_s",
        "n_blocks",
        "offer_idx",
        "prefill_left",
        "prefilled",
        "refused_at",
        "runs",
        "session",
        "turn",
    )

    def __init__(self, session: int, turn: int, arrival: float, runs: tuple[Run, ...]) -> None:
        self.session = session
        self.turn = turn
        self.arrival = arrival
        self.runs = runs
        self.n_blocks = sum(r.stop - r.start for r in runs)
        self.gpu_hit = 0
        self.host_hit = 0
        self.extra_blocks = 0
        self.computed = 0  # prompt tokens whose KV exists (cached, loaded or prefilled)
        self.prefill_left = 0
        self.prefilled = 0  # prompt tokens this request computes itself
        self.decode_left = 0
        self.first_token = -1.0
        self.offer_idx = 0
        self.refused_at = -1  # prompt blocks computed when an offer was last refused
        self.access_start = 0
        self.lookup_s = 0.0  # when it was admitted and looked the host tier up
        self.done_s = 0.0  # when it completed
        self.inserted: list[Run] = []


@dataclass(slots=True)
class Join:
    """A parent turn that waits for sub-agents (and for its own gap) before it arrives."""

    children: int = 0
    own_done: bool = False
    ready: float = 0.0
