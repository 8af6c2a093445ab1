"""`tenure bench policy`'s workload (100 live sessions, 3,000 requests): `tenure-density`'s cost per
call against vLLM's LRU with fewer idle residents scored per decision (`sample`), and `tenure`'s.

Usage: python sample_cost.py
"""
import sys
from tenure.benchmarks import policy as bp
from tenure.service.policy.density import TenureDensity
w = bp.Workload(sessions=100, requests=3000)
for rnd in range(2):
    lru = bp.measure("vllm-lru", w)
    for k in (16.0, 8.0, 4.0, 2.0):
        TenureDensity.defaults["sample"] = k
        m = bp.measure("tenure-density", w)
        print(f"sample {k:>4}: {m.cpu_ns/m.ops:7.0f} ns/op  x{(m.cpu_ns/m.ops)/(lru.cpu_ns/lru.ops):.2f}  stored {m.stored_blocks}")
    t = bp.measure("tenure", w); print(f"tenure: x{(t.cpu_ns/t.ops)/(lru.cpu_ns/lru.ops):.2f}")
