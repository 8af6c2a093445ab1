"""One recorded turn, and the hashes that stand for a request's content.

**Prefix structure without text.** A chat request's messages are serialised deterministically
(the model name first, then each message as canonical JSON) and cut into ``chunk_bytes`` pieces;
piece ``i`` is named by a 64-bit chained hash of every byte up to its end (as a prefix-cache
block hash names its block and everything before it). Two requests that share a prefix of
bytes share exactly the hashes of the pieces inside it, so appends, rewritten tails,
compactions and prompts shared between sessions all survive, and the text does not: a hash of
a 256-byte piece chained to everything before it cannot be read back.

**Per route** (``route``), the items hashed are the prompt's own structure:

* chat: the model, then each message (or the completion's prompt);
* messages (Anthropic): the model, the tools and the system prompt, then each message, every
  ``cache_control`` marker dropped (harnesses move the breakpoint to the newest message each
  turn; the prompt is the same);
* responses (OpenAI): the model, the instructions and tools, then each input item. A request
  that continues a stored answer (``previous_response_id``, or a ``conversation``) carries
  only its new input, while the engine's prompt holds the whole conversation: its pieces go
  on from the pieces of the request that answer came from, then pieces that stand for the
  answer (its estimated size, hashed from its id: never its text), then its own input.

**Session ids** leave the sidecar only as a keyed hash of ``tenant + session`` (the key lives in
Redis, shared by replicas and never exported), so two tenants' equal ids never meet and a
recording names no client's session.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import msgspec

__all__ = [
    "MAX_CHUNKS",
    "RecordedTurn",
    "hashed_session",
    "item_bytes",
    "prefix_chunks",
    "request_bytes",
]

_encode = msgspec.json.Encoder(order="deterministic").encode
#: A recorded turn keeps at most this many piece hashes (about 1 MiB of prompt at 256 bytes a
#: piece); a longer prompt keeps its first ones (the shared prefix is what matters) and its
#: byte count.
MAX_CHUNKS = 4096


class RecordedTurn(msgspec.Struct, omit_defaults=True):
    """One proxied call, as the recording keeps it."""

    session: str  # keyed hash of tenant + session id
    turn: int  # the sidecar's turn number (1, 2, ...)
    arrival_s: float  # when the request reached the sidecar (Unix seconds)
    end_s: float  # when the answer was complete
    chunks: list[int]  # chained 64-bit hashes of the request's pieces
    request_bytes: int
    prompt_tokens: int | None  # from the response's usage (None: the answer carried none)
    completion_tokens: int | None
    stop: str  # the answer's finish/stop reason ("" when none was seen)
    parent: str | None = None  # keyed hash of the parent session (a sub-agent)
    last_turn: bool = False  # the harness declared it the session's last turn
    expected_gap_s: float | None = None  # the harness's gap hint, if it sent one
    cut: bool = False  # the stream was cut after the answer started
    chunk_bytes: int = 256  # request bytes per hash when this turn was recorded
    route: str = "chat"  # the API it came through: chat, messages, responses
    #: The sidecar inferred the run's end at this turn (a one-shot harness's final answer, a
    #: sub-agent's answer; tenure.service.harness.profiles): what the replay's inferred ends apply.
    likely_end: bool = False


def request_bytes(model: object, messages: Sequence[object]) -> bytes:
    """The bytes a request's prefix structure is hashed over."""
    parts = [_encode(model)]
    parts.extend(_encode(m) for m in messages)
    return b"\n".join(parts)


def item_bytes(items: Sequence[object]) -> bytes:
    """The bytes of items that continue a request's prefix (each on its own line)."""
    return b"".join(b"\n" + _encode(m) for m in items)


def prefix_chunks(data: bytes, chunk_bytes: int, after: int | None = None) -> list[int]:
    """Chained 64-bit hashes of every ``chunk_bytes`` piece of ``data`` (the last may be short).

    ``after``: the hash of the piece these bytes follow (a request that continues a stored
    conversation goes on from the previous request's last piece); ``None``: they start it.
    """
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be >= 1")
    out: list[int] = []
    chain = b"" if after is None else after.to_bytes(8, "big")
    for start in range(0, min(len(data), MAX_CHUNKS * chunk_bytes), chunk_bytes):
        chain = hashlib.blake2b(chain + data[start : start + chunk_bytes], digest_size=8).digest()
        out.append(int.from_bytes(chain, "big") >> 1)  # 63 bits: a JSON int every reader keeps
    return out


def hashed_session(key: bytes, tenant: str, session: str) -> str:
    """The recorded name of ``session`` of ``tenant`` (keyed: unguessable without ``key``)."""
    mac = hashlib.blake2b(f"{tenant}\0{session}".encode(), key=key, digest_size=12)
    return mac.hexdigest()
