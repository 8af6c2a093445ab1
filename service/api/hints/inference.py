"""Session inference for harnesses that send no session header.

A chat request whose message list extends an earlier request's list continues that session:
turn ``n+1`` resends turn ``n``'s messages, then the assistant reply and the new user or tool
messages. So each request registers the hash of its whole message list, and looks up the hashes
of its own shorter prefixes (newest first, a bounded number). Hashes chain message by message, so
all prefix hashes cost one pass over the request; the model name seeds the chain because the same
messages under another model share no KV.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import msgspec

__all__ = ["LOOKBACK", "prefix_digests"]

#: Prefixes tried per request: a turn usually adds 2 messages, many parallel tool results more.
LOOKBACK = 16
_encode = msgspec.json.Encoder(order="deterministic").encode


def prefix_digests(model: object, messages: Sequence[object]) -> list[str]:
    """Digest of the whole list first, then of each shorter prefix (at most :data:`LOOKBACK`).

    Empty when there is nothing to chain (no messages).
    """
    if not messages:
        return []
    chain = hashlib.blake2b(_encode(model), digest_size=16).digest()
    digests: list[str] = []
    keep_from = max(1, len(messages) - LOOKBACK)
    for index, message in enumerate(messages, start=1):
        chain = hashlib.blake2b(chain + _encode(message), digest_size=16).digest()
        if index >= keep_from:
            digests.append(chain.hex())
    digests.reverse()
    return digests
