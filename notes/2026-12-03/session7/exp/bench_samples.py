import sys, json
sys.path.insert(0, __import__("os").path.dirname(__file__))
from tenure.service.policy.registry import register_policy
register_policy("tenure-density-s4", "dens_active:TenureDensitySample4")
register_policy("tenure-density-s8", "dens_active:TenureDensitySample8")
import tenure.engine_adapter.policies
from tenure.benchmarks.policy import measure, Workload
names = ["vllm-lru", "tenure", "tenure-density", "tenure-density-s8", "tenure-density-s4"]
for n in (10, 100, 10000):
    best = {}
    for rnd in range(3):
        for name in names:
            m = measure(name, Workload(n, 3000))
            if name not in best or m.cpu_ns < best[name].cpu_ns:
                best[name] = m
    lru = best["vllm-lru"].ns_per_op
    print(n, {k: (round(v.ns_per_op), round(v.ns_per_op / lru, 2)) for k, v in best.items()}, flush=True)
