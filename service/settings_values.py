"""The value checks and parsers behind :class:`tenure.service.settings.Settings`: tenant names, API
key digests, admin tokens, CURVE keys, Sentinel addresses, loopback hosts, and how a validation
error names a setting without echoing a secret. Pure: no I/O, no settings object.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from urllib.parse import urlsplit

__all__ = [
    "KEY_DIGEST",
    "MIN_ADMIN_TOKEN_CHARS",
    "TENANT_NAME",
    "TOKEN_CHARS",
    "Z85_KEY",
    "check_redis_url",
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
    """``"h1:26379,h2:26379"`` -> ``(("h1", 26379), ("h2", 26379))``; a clear error otherwise.

    A URL (``redis://:secret@h:26379``) is refused, never echoed: it would otherwise pass as
    the "host" ``redis://:secret@h``, which no Sentinel answers and every repr prints.
    """
    out: list[tuple[str, int]] = []
    for n, item in enumerate((part.strip() for part in value.split(",")), start=1):
        if not item:
            continue
        if _NOT_A_HOST.search(item):
            raise ValueError(
                f"TENURE_REDIS_SENTINELS: address {n} must be host:port, without a scheme or "
                "credentials (the Sentinels' password is TENURE_REDIS_SENTINEL_PASSWORD)"
            )
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"sentinel address {item!r} must be host:port")
        out.append((host.strip("[]"), int(port)))
    return tuple(out)


#: What no host name or address contains: a scheme, a path, credentials, a query.
_NOT_A_HOST = re.compile(r"[/@?#\s]")
_REDIS_SCHEMES = ("redis", "rediss", "unix")


def check_redis_url(url: str) -> None:
    """Refuse a Redis URL redis-py would fail on at the first connection (or at start-up,
    with a traceback): the scheme, host, port and database number. The message names the
    setting and never the value (it may carry a password)."""
    where = "TENURE_REDIS_URL"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(f"{where} is not a valid URL (host or port)") from None
    if parts.scheme not in _REDIS_SCHEMES:
        raise ValueError(f"{where} must start with redis://, rediss:// or unix://")
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError(f"{where}: a unix:// URL needs the socket's path")
        return
    if not parts.hostname:
        raise ValueError(f"{where} names no host")
    if port == 0:
        raise ValueError(f"{where}: port must be 1-65535")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"{where}: the path must be a database number (/0)")


def error_location(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] == "tenants":
        parts[1] = "<api-key>"  # the key of the tenants mapping is a secret
    return ".".join(parts) or "settings"
