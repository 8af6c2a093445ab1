import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
exec(open(__import__("os").path.join(__import__("os").path.dirname(__file__), "run.py")).read().split("seeds = ")[0])
from tenure.service.replay.metrics import summarize
seeds = [int(s) for s in sys.argv[1].split(",")]
rate, gib, hwn = float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile(hwn)
for p in sys.argv[5].split(","):
    runs = [simulate(trace, ReplayConfig(p, hw, gib, rate, s)) for s in seeds]
    m = summarize(runs, 100)
    c = {}
    for r in runs:
        for k, v in r.counters.items(): c[k] = c.get(k, 0) + v
    print(f"{p:30s} p50 {m['p50_jct_s']:.2f} mean {m['mean_jct_s']:.2f} p95 {m['p95_jct_s']:.1f} p95ttft {m['p95_ttft_s']:.1f} hit {m['host_hit_rate']:.3f} turns {m['turns']} thr {m['throughput_turns_per_s']:.5f} prefill {m['prefill_tokens']:.3g} refusals {c.get('refusals',0)} ev_util {c.get('evicted_blocks_utility',0)}", flush=True)
