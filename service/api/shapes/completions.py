"""``/v1/completions``: the OpenAI (legacy) Completions API.

A ``prompt`` has no message structure, so no session is inferred: a turn is tracked only when
a key names its session. Its answers carry the same ``choices`` as chat's, read by the same
readers (:mod:`tenure.service.api.shapes.chat`); errors are the OpenAI API's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tenure.service.api.shapes.base import Prepared, openai_error_shape
from tenure.service.api.shapes.chat import openai_stream_error, scan_choices, scan_choices_chunk

__all__ = ["CompletionsShape"]


class CompletionsShape:
    name = "completions"
    path = "/v1/completions"
    tracks_segments = True
    chat_messages = False
    error = staticmethod(openai_error_shape)
    scan_body = staticmethod(scan_choices)
    scan_chunk = staticmethod(scan_choices_chunk)
    stream_error = staticmethod(openai_stream_error)

    def prepare(self, payload: dict[str, Any], headers: Mapping[str, str]) -> Prepared:
        return Prepared()
