import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
exec(open(__import__("os").path.join(__import__("os").path.dirname(__file__), "run.py")).read().split("seeds = ")[0])
import numpy as np
seeds = [int(s) for s in sys.argv[1].split(",")]
rate, gib, hwn = float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile(hwn)
for p in sys.argv[5].split(","):
    runs = [simulate(trace, ReplayConfig(p, hw, gib, rate, s)) for s in seeds]
    t = lambda f: sum(float(np.sum(np.frombuffer(getattr(r, f), dtype=np.int64))) for r in runs)
    print(f"{p:30s} gpu_hit {t('gpu_hit_tokens'):.4g} host_hit {t('host_hit_tokens'):.4g} reusable {t('reusable_tokens'):.4g} prefill {t('prefill_tokens'):.4g} loaded {sum(r.host_bytes_loaded for r in runs):.4g} stored {sum(r.host_bytes_stored for r in runs):.4g} gpu_evicted {sum(r.counters.get('gpu_evicted_blocks',0) for r in runs)}", flush=True)
