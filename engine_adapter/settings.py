"""The adapter's settings from the environment, read in one place.

vLLM starts the adapter inside its own processes, where the only ways in are
``kv_connector_extra_config`` (per engine, in vLLM's command line) and the environment (per
host or container: the push channel's address and CURVE keys, which do not belong in a
command line). Every ``TENURE_*`` variable the adapter reads is named and read here;
``kv_connector_extra_config`` values, where given, take precedence (see the callers).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "CLIENT_SECRET_ENV",
    "ENGINE_ID_ENV",
    "PUSH_ADDR_ENV",
    "SERVER_KEY_ENV",
    "AdapterEnv",
    "adapter_env",
]

#: The sidecar's push channel (``tcp://host:port`` or ``ipc://path``); unset: no channel.
PUSH_ADDR_ENV = "TENURE_PUSH_ADDR"
#: This engine's id on the push channel (default: vLLM's engine id / a generated one).
ENGINE_ID_ENV = "TENURE_ENGINE_ID"
#: The sidecar's CURVE public key (Z85); unset: a plain channel.
SERVER_KEY_ENV = "TENURE_PUSH_SERVER_KEY"
#: This adapter's CURVE secret key (Z85).
CLIENT_SECRET_ENV = "TENURE_PUSH_CLIENT_SECRET_KEY"


@dataclass(frozen=True, slots=True)
class AdapterEnv:
    """What the environment says; empty strings read as unset."""

    push_addr: str | None = None
    engine_id: str | None = None
    push_server_key: str | None = None
    #: A secret: never in a repr or a log line.
    push_client_secret_key: str | None = field(default=None, repr=False)


def adapter_env(environ: Mapping[str, str] | None = None) -> AdapterEnv:
    """The adapter's settings from ``environ`` (default: this process's environment)."""
    env = os.environ if environ is None else environ
    return AdapterEnv(
        push_addr=env.get(PUSH_ADDR_ENV) or None,
        engine_id=env.get(ENGINE_ID_ENV) or None,
        push_server_key=env.get(SERVER_KEY_ENV) or None,
        push_client_secret_key=env.get(CLIENT_SECRET_ENV) or None,
    )
