"""How much the bound tightens with more prefix pieces per request (valid: fact 3 on smaller
groups). Reads a log saved by ``capture.py``. Usage: python pieces.py LOG.pkl"""
import pickle
import sys
import time

from tenure.service.replay import bound as B

log, cap, work = pickle.load(open(sys.argv[1], "rb"))
b0 = B.prefill_bound(log, cap, work).work
saved = B.saved_work(log, work)
for pieces in (1, 4, 16, 64):
    t = time.time()
    b = B.prefill_bound(log, cap, work, pieces, prefill_stores=True)
    print(f"pieces {pieces}: F-bound {b.work:.4g} ({b.work / b0:.3f} of bound), saved/it "
          f"{saved / b.work:.3f}, {b.intervals} vars, {time.time() - t:.1f}s", flush=True)
