#!/usr/bin/env bash
# Interleaved: tenure bench policy in a worktree of the code before the change
# (git worktree add /tmp/prev c29b84f) and in the working tree.
# Usage: cmp.sh [POLICY] [ROUNDS]
pol=${1:-tenure-density}; rounds=${2:-3}
for r in $(seq 1 $rounds); do
  for side in old new; do
    if [ $side = old ]; then dir=/tmp/prev; pp=/tmp/prev; else dir=/work/main; pp=/work/main; fi
    out=$(cd $dir && PYTHONPATH=$pp /work/main/.venv/bin/python -c "import sys; from tenure.service.cli import main; sys.exit(main())" bench policy --policy $pol --scaling 100 --repeats 2 2>&1 | grep -E "per call|per request" | tr -s ' ')
    echo "round $r $side: $out"
  done
done
