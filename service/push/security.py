"""Securing the push socket: CURVE keys, the ZAP allow-list of adapter keys, ``ipc://`` modes.

The threat model is in :mod:`tenure.service.push.server`'s docstring.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils import z85

__all__ = ["PushSecurity", "bind_ipc", "secure_socket"]


@dataclass(frozen=True, slots=True)
class PushSecurity:
    """How the push socket is secured (see the module's threat model)."""

    #: The sidecar's CURVE secret key (Z85); None: no CURVE.
    curve_secret_key: str | None = None
    #: Adapter name -> its CURVE public key (Z85): only these may connect.
    client_keys: Mapping[str, str] = field(default_factory=dict)
    #: Permissions of an ``ipc://`` socket file.
    ipc_mode: int = 0o600
    #: Peers tracked at once.
    max_adapters: int = 64
    #: Engine ids adapters may report under (configuration); others are labelled ``other``.
    #: Empty: the first ids heard, up to the metrics' label budget.
    engine_ids: frozenset[str] = frozenset()

    def __repr__(self) -> str:  # never the secret key
        return (
            f"PushSecurity(curve={self.curve_secret_key is not None}, "
            f"clients={sorted(self.client_keys)}, ipc_mode={self.ipc_mode:o})"
        )


class _NamedKeys(AsyncioAuthenticator):
    """ZAP: CURVE clients must hold one of the configured keys; their User-Id is its name."""

    def __init__(self, context: zmq.asyncio.Context, names: Mapping[str, str]) -> None:
        super().__init__(context=context)
        #: Z85 public key (bytes, as the ZAP handler passes it) -> adapter name.
        self._names = {key.encode(): name for key, name in names.items()}

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self._names

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self._names.get(z85.encode(client_public_key), "unknown")


def secure_socket(
    socket: zmq.asyncio.Socket, security: PushSecurity, ctx: zmq.asyncio.Context
) -> AsyncioAuthenticator | None:
    """Make ``socket`` a CURVE server (when a secret key is set); the ZAP handler it started."""
    secret = security.curve_secret_key
    if secret is None:
        return None
    auth: AsyncioAuthenticator | None = None
    if security.client_keys:
        names = {key: name for name, key in security.client_keys.items()}
        auth = _NamedKeys(ctx, names)
        auth.start()
        auth.configure_curve_callback("*", credentials_provider=auth)
    socket.curve_secretkey = secret.encode()
    socket.curve_publickey = zmq.curve_public(secret.encode())
    socket.curve_server = True
    return auth


def bind_ipc(socket: zmq.asyncio.Socket, path: str, mode: int) -> None:
    """Bind ``ipc://path`` with the socket file never more open than ``mode``."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a stale socket of an earlier run
    # The socket file is created with the umask's permissions: narrow it for the bind so
    # the file is never more open than ``mode``, then set ``mode`` exactly.
    previous = os.umask(0o777 & ~mode)
    try:
        socket.bind(f"ipc://{path}")
    finally:
        os.umask(previous)
    os.chmod(path, mode)
