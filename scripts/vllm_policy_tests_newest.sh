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
# The overlay stays in TENURE_VLLM_OVERLAY_ROOT/VERSION; tests/engine/test_vllm_newest.py
# runs the same tests when it finds one there (and skips, saying how to make one, when not).
set -euo pipefail
cd "$(dirname "$0")/.."
VPY=.venv/bin/python
ROOT=${TENURE_VLLM_OVERLAY_ROOT:-$HOME/.cache/tenure/vllm-overlay}
VERSION=${1:-}
if [[ -z "$VERSION" ]]; then
    VERSION=$("$VPY" -m pip index versions vllm 2>/dev/null | sed -n 's/^vllm (\(.*\))$/\1/p')
    [[ -n "$VERSION" ]] || { echo "could not ask the package index for vLLM's newest release" >&2; exit 2; }
fi
DEST="$ROOT/$VERSION"
if [[ ! -f "$DEST/vllm/v1/kv_offload/cpu/policies/base.py" ]]; then
    WHEELS=$(mktemp -d)
    trap 'rm -rf "$WHEELS"' EXIT
    echo "downloading vllm==$VERSION (no dependencies) ..."
    "$VPY" -m pip download -q "vllm==$VERSION" --no-deps --only-binary :all: -d "$WHEELS" 2>&1 \
        | { grep -v 'is ignored: it is neither' || true; }
    mkdir -p "$DEST.partial"
    "$VPY" - "$WHEELS" "$DEST.partial" <<'PY'
import pathlib, sys, zipfile
wheels, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(wheel,) = wheels.glob("vllm-*.whl")
with zipfile.ZipFile(wheel) as archive:
    names = [n for n in archive.namelist() if n.startswith("vllm/") and n.endswith(".py")]
    archive.extractall(dest, names)
print(f"unpacked {len(names)} pure-Python modules of {wheel.name}")
PY
    rm -rf "$DEST" && mv "$DEST.partial" "$DEST"
fi
echo "vLLM $VERSION overlay: $DEST"
exec env TENURE_VLLM_OVERLAY="$DEST" "$VPY" -m pytest -q -p no:cacheprovider \
    tests/engine/test_vllm_newest.py "${@:2}"
