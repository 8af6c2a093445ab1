"""Rename a deployment's keys between the plain and the hash-tagged layout.

``tenure:s:T:S`` and ``{tenure}:s:T:S`` name the same record in the two layouts
(:meth:`tenure.service.state.keys.Keys.build`). Moving a deployment to Redis Cluster, or back,
renames every key under its prefix; session records also list their inference keys by name (``px``),
which are rewritten. Run it with the sidecars stopped, on a single server (standalone or the
Sentinel master: ``RENAME`` cannot cross cluster slots), then move the data (e.g.
``redis-cli --cluster import``). Keys already in the target layout are left alone, so a
second run changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from tenure.service.state.keys import Keys

__all__ = ["MigrationReport", "migrate_keys"]


@dataclass(frozen=True, slots=True)
class MigrationReport:
    renamed: int
    records_rewritten: int
    conflicts: list[str]


def migrate_keys(
    client: redis.Redis, prefix: str, *, to_hash_tag: bool, dry_run: bool = False
) -> MigrationReport:
    """Rename ``prefix``'s keys into the layout ``to_hash_tag`` names."""
    source = Keys.build(prefix, hash_tag=not to_hash_tag).prefix
    target = Keys.build(prefix, hash_tag=to_hash_tag).prefix
    # SCAN's MATCH treats braces literally but ``[`` specially; prefixes cannot hold ``[``.
    pattern = source.replace("{", "\\{").replace("}", "\\}") + ":*"
    renamed = rewritten = 0
    conflicts: list[str] = []
    for raw in client.scan_iter(match=pattern, count=1000):
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        new = target + name[len(source) :]
        if client.exists(new):
            conflicts.append(name)  # never overwrite what the target layout already holds
            continue
        if client.type(name) in (b"hash", "hash"):
            px = client.hget(name, "px")
            if px:
                text = px.decode() if isinstance(px, bytes) else str(px)
                names = [
                    target + n[len(source) :] if n.startswith(source + ":") else n
                    for n in text.split()
                ]
                if not dry_run:
                    client.hset(name, "px", " ".join(names))
                rewritten += 1
        if not dry_run:
            client.rename(name, new)
        renamed += 1
    return MigrationReport(renamed, rewritten, conflicts)
