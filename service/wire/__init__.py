"""Wire and record formats shared by the sidecar, the push channel and the engine adapter.

One leaf layer above the pure core (:mod:`tenure.service.policy`) and below everything that talks:
the Redis state (:mod:`tenure.service.state`), the push server (:mod:`tenure.service.push`), the
HTTP API and the adapter all import these definitions, and this package imports only the core. Each
format is defined once here:

* :mod:`tenure.service.wire.push` - the push channel's typed messages (decisions, snapshots,
  reports);
* :mod:`tenure.service.wire.decision_codec` - a decision's JSON as the Lua scripts store it, split
  around ``seq`` so the script can number it atomically;
* :mod:`tenure.service.wire.session_record` - the Redis session hash, typed, with its field names;
* :mod:`tenure.service.wire.segments` - the segment tags a request carries in
  ``kv_transfer_params``.
"""
