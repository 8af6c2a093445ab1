"""Tenure: KV-cache lifecycle control for agent serving, under one import name.

The sidecar is :mod:`tenure.service`, the vLLM engine adapter :mod:`tenure.engine_adapter`,
the harness SDK :mod:`tenure.clients` (``from tenure.clients import TenureSession``) and the
benchmarks :mod:`tenure.benchmarks`. A wheel installs only this package, so no generic name
(``service``, ``clients``, ...) lands in site-packages. In a source checkout the four
sub-packages are relative symlinks to the repository's top-level folders (``tenure/service ->
../service``), so ``PYTHONPATH=$PWD``, pytest, mypy and the docs build import the same files
by the same names as an installed wheel does. Nothing is imported here.
"""
