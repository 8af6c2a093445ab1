"""``tenure calibrate``: measure the retention price vector on a live vLLM engine (seed 002 App. B).

:mod:`tenure.service.calibrate.engine` talks to the engine (OpenAI API, ``/tokenize``, Prometheus
``/metrics``); :mod:`tenure.service.calibrate.procedure` runs the measurements and derives the
vector; :mod:`tenure.service.calibrate.cli` is the command (and writes the vector to a running
sidecar).
"""
