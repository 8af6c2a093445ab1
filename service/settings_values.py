"""The value checks and parsers behind :class:`service.settings.Settings`: tenant names, API key
digests, admin tokens, CURVE keys, Sentinel addresses, loopback hosts, and how a validation
error names a setting without echoing a secret. Pure: no I/O, no settings object.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re

__all__ = [
    "KEY_DIGEST",
    "MIN_ADMIN_TOKEN_CHARS",
    "TENANT_NAME",
    "TOKEN_CHARS",
    "Z85_KEY",
    "error_location",
    "is_loopback_host",
    "parse_sentinels",
    "tenant_key_digest",
]

TENANT_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
#: How a tenant key may be given already hashed (and how ``Settings`` keeps every key).
KEY_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
#: Shortest admin token accepted: a guessable token is an open admin API.
MIN_ADMIN_TOKEN_CHARS = 12
#: Visible ASCII only: what an HTTP header carries unchanged, and never all blanks.
TOKEN_CHARS = re.compile(r"^[\x21-\x7e]+$")
Z85_KEY = re.compile(r"^[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")


def tenant_key_digest(key: str) -> str:
    """``sha256:<hex>`` of a tenant API key; a key already in that form is kept as it is."""
    if KEY_DIGEST.match(key):
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (the only binds a local user owns)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_sentinels(value: str) -> tuple[tuple[str, int], ...]:
    """``"h1:26379,h2:26379"`` -> ``(("h1", 26379), ("h2", 26379))``; a clear error otherwise."""
    out: list[tuple[str, int]] = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"sentinel address {item!r} must be host:port")
        out.append((host.strip("[]"), int(port)))
    return tuple(out)


def error_location(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] == "tenants":
        parts[1] = "<api-key>"  # the key of the tenants mapping is a secret
    return ".".join(parts) or "settings"
