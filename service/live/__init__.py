"""The live A/B: a slice of a real agent trace through the sidecar into a real engine.

:mod:`tenure.service.live.workload` cuts and scales the slice (each trace block one fixed token, the
gaps time-compressed) and derives the engine-level trace the simulator replays;
:mod:`tenure.service.live.driver` plays it through the proxy as concurrent agent sessions;
:mod:`tenure.service.live.arm` runs one arm on a fresh stack; :mod:`tenure.service.live.sizing`
sizes the engine pool and host tier by the pressure rule; :mod:`tenure.service.live.simulated`
replays the same slice in the simulator; :mod:`tenure.service.live.report` turns both into the
table, JSON and plot; :mod:`tenure.service.live.cli` is ``tenure up``'s A/B.
"""
