"""Paired p95 and saved/bound of policies (variants included) at one point.
Usage: run.py SEEDS RATE GIB HARDWARE POLICY,POLICY,... (the first is the baseline)."""
import sys, json
sys.path.insert(0, __import__("os").path.dirname(__file__))
from tenure.service.policy.registry import register_policy
register_policy("tenure-density-active", "dens_active:TenureDensityActive"); register_policy("tenure-active", "gate_active:TenureGateActive"); register_policy("tenure-density-active-noyield", "dens_active:TenureDensityActiveNoYield"); register_policy("tenure-density-noyield", "dens_active:TenureDensityNoYield");  register_policy("tenure-density-active-looked", "dens_active:TenureDensityActiveLooked"); register_policy("tenure-density-active-waiting", "dens_active:TenureDensityActiveWaiting"); register_policy("tenure-density-waitzero", "dens_active:TenureDensityWaitZero"); register_policy("tenure-waiting", "gate_wait:TenureGateWaiting"); register_policy("tenure-density-nowaiting", "dens_active:TenureDensityNoWaiting"); register_policy("tenure-density-s4", "dens_active:TenureDensitySample4"); register_policy("tenure-density-s8", "dens_active:TenureDensitySample8"); register_policy("tenure-density-noyield-now", "dens_active:TenureDensityNoYieldNow")
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.engine import simulate
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace
from tenure.service.replay.metrics import samples
from tenure.service.replay.stats import paired_delta, percentile
seeds = [int(s) for s in sys.argv[1].split(",")]
rate, gib, hwn = float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
pols = sys.argv[5].split(",")
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile(hwn)
runs = {p: [simulate(trace, ReplayConfig(p, hw, gib, rate, s, bound=True)) for s in seeds] for p in pols}
base = samples(runs[pols[0]], "jct_s")
for p in pols:
    a = samples(runs[p], "jct_s")
    sv = sum(r.saved_work for r in runs[p]) / sum(r.bound_work for r in runs[p])
    hit = sum(r.host_hit_rate for r in runs[p]) / len(seeds) if hasattr(runs[p][0], "host_hit_rate") else float("nan")
    d = paired_delta(a, base, 95, 1000) if p != pols[0] else (0, 0, 0)
    print(f"{p:28s} p95 {percentile(a, 95):8.1f}  saved/bound {sv:.3f}  vs {pols[0]}: {d[0]:+.1f} [{d[1]:+.1f}, {d[2]:+.1f}]", flush=True)
