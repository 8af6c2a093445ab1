"""Pool the fixed-timing clairvoyant's ratios over seeds: saved sums over bound sums."""
import pickle, re, sys
from collections import defaultdict
from tenure.service.replay import bound as B
rows = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0])  # clairvoyant, run, bound, fbound, n
for path in sys.argv[1:]:
    for line in open(path):
        m = re.match(r"/work/s9/log_(.+)_(\d)\.pkl mode (\S+): clairvoyant fixed-timing saved/bound ([\d.]+) .*the run itself ([\d.]+)", line)
        if not m:
            continue
        pol, seed, mode, cv, run = m.group(1), m.group(2), m.group(3), float(m.group(4)), float(m.group(5))
        log, cap, work = pickle.load(open(f"/work/s9/log_{pol}_{seed}.pkl", "rb"))
        b0 = B.prefill_bound(log, cap, work).work
        fb = B.prefill_bound(log, cap, work, prefill_stores=True).work
        r = rows[(pol, mode)]
        r[0] += cv * b0; r[1] += B.saved_work(log, work); r[2] += b0; r[3] += fb; r[4] += 1
        print(f"{pol} seed {seed} {mode}: clairvoyant {cv:.3f} run {run:.3f}")
for (pol, mode), (cv, run, b0, fb, n) in sorted(rows.items()):
    print(f"POOLED {pol} {mode} ({n:.0f} seeds): clairvoyant {cv / b0:.3f} (/F {cv / fb:.3f}), run {run / b0:.3f} (/F {run / fb:.3f}), run/clairvoyant {run / cv:.2f}")
