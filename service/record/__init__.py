"""Recorded traffic for what-if: the sidecar's proxied turns as a canonical-format trace.

:mod:`tenure.service.record.events` is one recorded turn (no text: prefix structure as chained
hashes of the request's bytes, token counts from the response's usage, session ids hashed per
tenant); :mod:`tenure.service.record.canonical` turns a recording into the ``tenure-sessions``
format that ``tenure replay ladder --format canonical`` replays. Both are pure; the sidecar's hook
and the bounded Redis log are :mod:`tenure.service.api.turns.recorder`, the export command
:mod:`tenure.service.record.cli`.
"""
