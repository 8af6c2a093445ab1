#!/usr/bin/env bash
# Run vLLM's own CPU offloading manager / cache-policy tests with every registered Tenure
# policy in place of vLLM's lru/arc, under vLLM's stock CPUOffloadingManager and under
# engine_adapter's TenureOffloadingManager, and summarise every outcome.
#
# This script fetches nothing and contains no vLLM code: you provide the vLLM source tree, at
# the revision matching the installed vLLM (0.32.0 here), e.g. one of
#
#   git clone --depth 1 --branch v0.32.0 https://github.com/vllm-project/vllm /tmp/vllm-src
#   # or the source distribution from PyPI (it ships tests/):
#   pip download --no-deps --no-binary :all: --no-build-isolation vllm==0.32.0  # needs build deps
#   tar xzf vllm-0.32.0.tar.gz -C /tmp   # -> /tmp/vllm-0.32.0
#
# Usage:  scripts/run_vllm_offload_tests.sh VLLM_SRC [OUT_DIR]
#   VLLM_SRC  the vLLM source tree (has tests/v1/kv_offload/cpu/test_manager.py)
#   OUT_DIR   where results.jsonl, results.csv and summary.md go (default: a new temp dir)
# Env:  VLLM_OVERLAY=DIR                  run on a release's pure-Python modules instead of the
#                                          installed vLLM (scripts/vllm_overlay.sh 0.33.0 makes
#                                          one; VLLM_SRC is then that release's source tree)
#       POLICIES="tenure tenure-lru ..."  (default: every registered policy)
#       MANAGERS="stock tenure"            (default: both)
#       FORCE=1                            run even if VLLM_SRC's kv_offload differs
#       TENURE_VLLM_CONTRACT=0             no contract checks: a reference run with one of
#                                          vLLM's own policies (POLICIES=arc: vLLM's ARC in
#                                          the LRU tests), compared with vLLM's as usual
#
# The tests are copied to a scratch directory (never into this repository) and run with the
# pytest plugin scripts/vllm_offload_shim.py, which routes the policies, checks the
# CachePolicy contract after every call and records, for each failing test, where the policy
# first parted from vLLM's own (scripts/vllm_offload_summary.py classifies the outcomes).
# Exit status 1 if any run had a contract violation, a crash or an unexplained failure.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
src=${1:?usage: $0 VLLM_SRC [OUT_DIR]}
src=$(cd "$src" && pwd)
out=${2:-$(mktemp -d -t tenure-vllm-tests.XXXXXX)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
if [ -n "${VLLM_OVERLAY:-}" ]; then
    # The release's own offloading code (and ours) first on the path; torch and the rest from
    # the installed build. Only engine-free tests run, so nothing compiled is loaded.
    export PYTHONPATH="$VLLM_OVERLAY:$repo${PYTHONPATH:+:$PYTHONPATH}"
fi

tests=(tests/v1/kv_offload/cpu/test_manager.py tests/v1/kv_offload/cpu/policies/test_factory.py)
for t in "${tests[@]}"; do
    [ -f "$src/$t" ] || { echo "error: $src/$t not found (not a vLLM source tree?)" >&2; exit 2; }
done

installed=$("$py" -c 'import os, vllm.v1.kv_offload as m; print(os.path.dirname(m.__file__))')
version=$("$py" -c 'import vllm; print(vllm.__version__)')
if ! diff -rq -x __pycache__ "$src/vllm/v1/kv_offload" "$installed" >/dev/null; then
    echo "vllm/v1/kv_offload in $src differs from the installed vLLM $version ($installed)" >&2
    [ "${FORCE:-0}" = 1 ] || { echo "error: wrong revision (FORCE=1 to run anyway)" >&2; exit 2; }
fi
echo "vLLM source $src matches the installed vLLM $version (vllm/v1/kv_offload identical)"

work=$(mktemp -d -t tenure-vllm-work.XXXXXX)
trap 'rm -rf "$work"' EXIT
for t in "${tests[@]}"; do
    mkdir -p "$work/$(dirname "$t")"
    cp "$src/$t" "$work/$t"
done
# Package markers only (the tests load a policy by module path tests.v1.kv_offload...).
for d in tests tests/v1 tests/v1/kv_offload tests/v1/kv_offload/cpu tests/v1/kv_offload/cpu/policies; do
    : > "$work/$d/__init__.py"
done

if [ -z "${POLICIES:-}" ]; then
    POLICIES=$("$py" -c 'from tenure.engine_adapter.plugin import registered_policy_names as r; print(" ".join(sorted(r())))')
fi
MANAGERS=${MANAGERS:-stock tenure}
results="$out/results.jsonl"
: > "$results"

run() {  # policy manager
    (cd "$work" && TENURE_VLLM_POLICY=$1 TENURE_VLLM_MANAGER=$2 TENURE_VLLM_RESULTS="$results" \
        PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$py" -m pytest -q -p no:cacheprovider -p vllm_offload_shim \
        -W ignore::DeprecationWarning -W ignore::FutureWarning "${tests[@]}" 2>&1 | tail -n 1)
}

echo "baseline (vLLM's own policies): $(run none stock)"
for manager in $MANAGERS; do
    for policy in $POLICIES; do
        echo "$manager manager, $policy: $(run "$policy" "$manager")"
    done
done

status=0
"$py" "$here/vllm_offload_summary.py" "$results" --csv "$out/results.csv" > "$out/summary.md" \
    || status=$?
echo "summary: $out/summary.md (per run: $out/results.csv)"
exit $status
