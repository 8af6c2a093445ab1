#!/usr/bin/env bash
# The replay's GPU physics measured on this CUDA host in one short run (about 5 minutes on one
# H200): prefill and decode of a random-weight model with Llama-3.1-8B's exact config in bf16,
# and host-tier KV block transfers in vLLM's layout over pinned memory. Needs torch and
# transformers (no vLLM, no network, no download). Writes
# service/replay/profiles/h200-llama3-8b-measured.json, which the replay loads by name:
#
#   scripts/gpu_profile.sh                       # on the GPU host
#   scripts/gpu_profile.sh --cpu-dry-run --out /tmp   # every step, tiny shape, on a CPU
#   tenure replay ... --hardware h200-llama3-8b-measured
#
# Extra arguments go to `tenure calibrate-profile --gpu` (--name, --spec-profile, --out).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[[ -x "$PY" ]] || PY=python3
exec env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m tenure.service.cli calibrate-profile --gpu "$@"
