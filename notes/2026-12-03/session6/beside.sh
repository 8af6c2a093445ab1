#!/bin/bash
# The CPU-heavy job beside the row: whole-trace ladders, seeds cycling, while ci3x.sh runs.
cd /work/main; n=0
sleep 20
while pgrep -f "ci3x.sh" > /dev/null; do
  s=$((n % 3)); echo "ladder seed $s start $(date -u)" >> /work/s6/ci/beside.log
  nice -n 5 .venv/bin/tenure replay ladder --trace ../shared/traces/claude_code/sessions.jsonl.gz \
    --arrival-rate 0.001 --host-gib 32 --hardware h100-llama3-8b --seeds $s --jobs 1 \
    --json /work/s6/ladder/seed${s}_$n.json >> /work/s6/ci/beside.log 2>&1
  echo "ladder seed $s rc=$? end $(date -u)" >> /work/s6/ci/beside.log; n=$((n+1))
done
