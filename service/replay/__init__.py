"""Trace replay: loaders, a discrete-event engine model, experiments, statistics and plots.

``simulate(trace, config) -> RunResult`` (:mod:`tenure.service.replay.engine`) is separate from
loading (:mod:`tenure.service.replay.loaders`) and from the experiment / statistics / plotting
layers, and the policies it drives are the ones in :mod:`tenure.service.policy` that ship in the
sidecar and adapter.
"""

__all__: list[str] = []
