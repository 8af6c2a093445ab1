#!/usr/bin/env bash
# The pure-Python modules of a vLLM release as an overlay directory (no install, no compiled
# parts): the wheel is downloaded with --no-deps, only its .py files are unpacked, into
# TENURE_VLLM_OVERLAY_ROOT/VERSION (default ~/.cache/tenure/vllm-overlay/VERSION). Idempotent:
# an existing overlay is kept. Prints the overlay's path on stdout.
#
#   scripts/vllm_overlay.sh 0.33.0
set -euo pipefail
cd "$(dirname "$0")/.."
VPY=${PYTHON:-.venv/bin/python}
ROOT=${TENURE_VLLM_OVERLAY_ROOT:-$HOME/.cache/tenure/vllm-overlay}
VERSION=${1:?usage: $0 VERSION}
DEST="$ROOT/$VERSION"
if [[ ! -f "$DEST/vllm/v1/kv_offload/cpu/policies/base.py" ]]; then
    WHEELS=$(mktemp -d)
    trap 'rm -rf "$WHEELS"' EXIT
    echo "downloading vllm==$VERSION (no dependencies) ..." >&2
    "$VPY" -m pip download -q "vllm==$VERSION" --no-deps --only-binary :all: -d "$WHEELS" 2>&1 \
        | { grep -v 'is ignored: it is neither' || true; } >&2
    mkdir -p "$DEST.partial"
    "$VPY" - "$WHEELS" "$DEST.partial" <<'PY' >&2
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
echo "$DEST"
