"""A decision's JSON as the state scripts store and publish it.

The Lua scripts number decisions atomically (``INCR`` of the sequence key inside the script),
so the sidecar sends a decision with ``seq`` 0, split around that value: the script joins
``head .. seq .. tail``. The stored JSON decodes back to the push channel's
:class:`~tenure.service.wire.push.Decision`, so the stream, the table and the push snapshot are one
format.
"""

from __future__ import annotations

import msgspec

from tenure.service.wire.push import Decision

__all__ = ["decision_body", "decision_parts", "decode_decision"]

_json_encode = msgspec.json.Encoder().encode
_decision_decoder = msgspec.json.Decoder(Decision)
_SEQ_ZERO = b'"seq":0'


def decision_body(decision: Decision) -> bytes:
    """JSON of a decision for the scripts, which fill in ``seq`` (and the hot path's ``turn``)."""
    return _json_encode(decision)


def decision_parts(decision: Decision) -> tuple[bytes, bytes]:
    """A decision's JSON (``seq`` 0) split around its ``seq`` value, for APPLY to join."""
    body = _json_encode(decision)
    # ``seq`` is the first field after the tag, so this is its own occurrence, never text
    # inside a later string value.
    at = body.find(_SEQ_ZERO)
    if decision.seq != 0 or at < 0 or body[at + len(_SEQ_ZERO)] not in b",}":
        raise ValueError("decision_parts needs a decision whose seq is 0")
    return body[: at + 6], body[at + len(_SEQ_ZERO) :]


def decode_decision(body: bytes | str) -> Decision:
    return _decision_decoder.decode(body)
