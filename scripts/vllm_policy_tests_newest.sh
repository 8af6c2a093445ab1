#!/usr/bin/env bash
# The adapter's policy tests against the pure-Python offloading modules of another vLLM
# release (default: the newest on the package index), without installing it: the wheel is
# downloaded with --no-deps, only its .py files are unpacked (no compiled parts), and they go
# first on PYTHONPATH while torch, numpy and the rest come from this checkout's .venv (the
# installed CPU build's dependencies). The policy, manager and contract tests need no engine,
# so vLLM's compiled kernels are never loaded; what runs is the release's own CachePolicy /
# CPUOffloadingManager code calling ours (0.33: insert(key, chunk, req_context)).
#
#   scripts/vllm_policy_tests_newest.sh [VERSION]        # e.g. 0.33.0
#   TENURE_VLLM_OVERLAY_ROOT=DIR ... (default ~/.cache/tenure/vllm-overlay)
#
# The overlay (scripts/vllm_overlay.sh, which scripts/bootstrap.sh runs for 0.33.0) stays in
# TENURE_VLLM_OVERLAY_ROOT/VERSION; tests/engine/test_vllm_newest.py runs the same tests on
# it in the normal suite (and fails, saying how to make one, when there is none).
set -euo pipefail
cd "$(dirname "$0")/.."
VPY=.venv/bin/python
VERSION=${1:-}
if [[ -z "$VERSION" ]]; then
    VERSION=$("$VPY" -m pip index versions vllm 2>/dev/null | sed -n 's/^vllm (\(.*\))$/\1/p')
    [[ -n "$VERSION" ]] || { echo "could not ask the package index for vLLM's newest release" >&2; exit 2; }
fi
DEST=$(scripts/vllm_overlay.sh "$VERSION")
echo "vLLM $VERSION overlay: $DEST"
exec env TENURE_VLLM_OVERLAY="$DEST" "$VPY" -m pytest -q -p no:cacheprovider \
    tests/engine/test_vllm_newest.py "${@:2}"
