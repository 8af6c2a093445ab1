"""The adapter side's one way to open a push-channel socket to the sidecar.

The engine's one push connection (``push_client``: the sidecar's decisions, the policy's
reports and the SSD tier's placement reports) connects a ZeroMQ DEALER this way: no linger,
queue only while connected, reconnect quickly, and CurveZMQ when the sidecar publishes a server
key (an engine without its own key gets an ephemeral one, which the sidecar accepts only if it
allows any key).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

__all__ = ["dealer", "run_connected"]


def dealer(
    ctx: zmq.Context[zmq.Socket[bytes]],
    addr: str,
    *,
    server_key: str | None,
    client_secret: str | None,
    send_hwm: int,
) -> zmq.Socket[bytes]:
    """A connected DEALER to ``addr``; the caller owns (and closes) it."""
    sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.SNDHWM, send_hwm)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    try:
        if server_key is not None:
            secret = client_secret.encode() if client_secret is not None else zmq.curve_keypair()[1]
            sock.curve_serverkey = server_key.encode()
            sock.curve_secretkey = secret
            sock.curve_publickey = zmq.curve_public(secret)
        sock.connect(addr)
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


def run_connected(
    addr: str,
    loop: Callable[[zmq.Socket[bytes]], None],
    *,
    server_key: str | None,
    client_secret: str | None,
    send_hwm: int,
    log: logging.Logger,
    what: str,
) -> None:
    """A sender thread's body: connect, run ``loop`` on the socket, and close both ends.

    Any failure is logged as ``"<what> stopped"`` and swallowed: the channel must never take
    the engine down."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock: zmq.Socket[bytes] | None = None
    try:
        sock = dealer(
            ctx, addr, server_key=server_key, client_secret=client_secret, send_hwm=send_hwm
        )
        loop(sock)
    except Exception:
        log.exception("%s stopped", what)
    finally:
        if sock is not None:
            sock.close(linger=0)
        ctx.term()
