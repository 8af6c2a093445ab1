#!/usr/bin/env bash
# A real run for the docs' dashboard pictures (docs/assets/dashboards/row-*.png).
#
# Starts a Prometheus (Debian's, as bootstrap installs it) with the shipped recording and alert
# rules (deploy/prometheus/rules.yml) scraping a local stack every 5 s; starts that stack
# (`tenure up --scripted --keep-running`: Redis, a CPU vLLM with the Tenure adapter and the tiny
# random-weight model, the sidecar) and its scripted demo; then plays agent sessions through the
# sidecar (clients/examples/agent_loop.py: tool waits, a sub-agent, an approval suspend/resume,
# a last turn) from a few workers for TRAFFIC_S seconds; then draws every row of the Grafana
# dashboard from that Prometheus (scripts/dashboard_shots.py) and stops everything.
#
#   bash scripts/dashboard_run.sh            # ~5-8 minutes on a 2-core VM
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SIDECAR=${SIDECAR_PORT:-18400}
ENGINE=${ENGINE_PORT:-18401}
PROM=${PROM_PORT:-18490}
TRAFFIC_S=${TRAFFIC_S:-240}
WORKERS=${WORKERS:-3}
OUT=${OUT:-docs/assets/dashboards}
WORK=$(mktemp -d /tmp/tenure-dashboard-run.XXXXXX)
export PYTHONPATH=$ROOT

cat >"$WORK/prometheus.yml" <<EOF
global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: ["$ROOT/deploy/prometheus/rules.yml"]
scrape_configs:
  - job_name: tenure-sidecar
    static_configs: [{targets: ["127.0.0.1:$SIDECAR"], labels: {component: sidecar}}]
  - job_name: vllm
    static_configs: [{targets: ["127.0.0.1:$ENGINE"], labels: {component: engine}}]
EOF

pids=()
cleanup() {
    # TERM, not INT: a background job of a script starts with SIGINT ignored.
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
    --web.listen-address="127.0.0.1:$PROM" >"$WORK/prometheus.log" 2>&1 &
pids+=($!)
START=$(date +%s)
# `tenure up --scripted --keep-running`, with a longer engine start-up allowance than the
# CLI's (a loaded VM takes minutes to import vLLM).
.venv/bin/python - "$WORK/stack" "$SIDECAR" "$ENGINE" >"$WORK/up.log" 2>&1 <<'PY' &
import signal, sys, time
from pathlib import Path
from tenure.service.stack import LocalStack, StackConfig
from tenure.service.stack_cli import run_demo

def stop(signum, frame):
    raise KeyboardInterrupt  # the finally below stops Redis, the engine and the sidecar


signal.signal(signal.SIGTERM, stop)
work, proxy, engine = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
config = StackConfig(workdir=work, model_cache=Path.home() / ".cache/tenure/models",
                     proxy_port=proxy, engine_port=engine, engine_timeout_s=1200.0)
stack = LocalStack(config, progress=lambda line: print(line, flush=True))
try:
    stack.start()
    run_demo(stack)
    print("demo done; serving until interrupted (Ctrl-C)", flush=True)
    while all(p is None or p.running for p in (stack.redis, stack.sidecar, stack.engine)):
        time.sleep(1.0)
except KeyboardInterrupt:
    pass
finally:
    stack.stop()
PY
UP=$!
pids+=("$UP")
echo "run in $WORK; waiting for the stack and its scripted demo"
until grep -q "Ctrl-C" "$WORK/up.log"; do
    kill -0 "$UP" 2>/dev/null || { cat "$WORK/up.log"; echo "tenure up exited"; exit 1; }
    sleep 2
done

STOP_AT=$(($(date +%s) + TRAFFIC_S))
agent_worker() {
    local n=0
    while [ "$(date +%s)" -lt "$STOP_AT" ]; do
        n=$((n + 1))
        .venv/bin/python -m tenure.clients.examples.agent_loop --model tiny --turns 6 \
            --base-url "http://127.0.0.1:$SIDECAR/v1" --tool-s 1 --approval-s 3 \
            --session-id "w$1-$n" >>"$WORK/agents.log" 2>&1 || echo "session w$1-$n failed" >>"$WORK/agents.log"
    done
}
workers=()
for w in $(seq "$WORKERS"); do agent_worker "$w" & workers+=($!); done
wait "${workers[@]}"
sleep 15 # one more scrape and rule evaluation after the last turn
END=$(date +%s)
echo "sessions: $(grep -c 'sidecar record' "$WORK/agents.log" || true)," \
    "failed: $(grep -c 'failed' "$WORK/agents.log" || true); $START..$END"
.venv/bin/python scripts/dashboard_shots.py --prometheus "http://127.0.0.1:$PROM" \
    --start "$START" --end "$END" --step-s 5 --out "$OUT" | tee "$WORK/shots.txt"
echo "logs: $WORK"
