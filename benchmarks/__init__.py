"""The ``tenure bench ...`` harnesses, one module per benchmark, on top of the house.

Nothing imports this package but the CLI: it may import anything below it (the sidecar, the
adapter, the replay, the SDK) and shares one process manager (:mod:`tenure.service.processes`: one
way to start ``redis-server`` and the sidecar) and one percentile routine
(:mod:`tenure.benchmarks.stats`).

* :mod:`tenure.benchmarks.proxy` - ``tenure bench proxy``: the proxy's added latency and throughput
  (canned upstream in :mod:`tenure.benchmarks.proxy_load`, plot in
  :mod:`tenure.benchmarks.proxy_plot`, CPU placement in :mod:`tenure.benchmarks.cpus`);
* :mod:`tenure.benchmarks.policy` - ``tenure bench policy``: the adapter policy's per-call cost;
* :mod:`tenure.benchmarks.replay` - ``tenure bench replay``: one replay's wall time and memory;
* :mod:`tenure.benchmarks.sdk` - ``tenure bench sdk``: what the client SDK adds per call.
"""
