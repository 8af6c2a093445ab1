"""A Redis connection that packs commands with hiredis' C packer.

redis-py's asyncio connection packs every command in Python (an encode call and several byte
joins per argument); the proxy's Lua calls carry about ten arguments each, which made packing
one of the larger items in the sidecar's per-request CPU profile. ``hiredis.pack_command``
produces the same bytes (checked by a test) in C. Anything it does not take (a bool, None, an
unsupported type) goes to redis-py's packer, so errors stay redis-py's. The hot path's own
connection (:mod:`tenure.service.state.multiplex`) packs with the same function.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.connection import Connection

__all__ = ["HiredisPackedConnection", "pack_command"]


def pack_command(*args: Any) -> bytes:
    """One command in Redis's wire format, packed by hiredis (what it refuses, redis-py packs)."""
    first = args[0]
    # redis-py sends "CONFIG GET"-style names as separate words; keep that behaviour.
    if (isinstance(first, str) and " " in first) or (isinstance(first, bytes) and b" " in first):
        args = (*first.split(), *args[1:])
    try:
        packed: bytes = hiredis.pack_command(args)
    except TypeError:  # a bool, None, ...: redis-py's packer raises its own error (or packs)
        return b"".join(bytes(part) for part in Connection().pack_command(*args))
    return packed


class HiredisPackedConnection(Connection):
    def pack_command(self, *args: Any) -> list[bytes]:
        return [pack_command(*args)]
