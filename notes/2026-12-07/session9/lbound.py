import pickle, dataclasses, sys
from tenure.service.replay import bound as B
log, cap, work = pickle.load(open(sys.argv[1], "rb"))
saved = B.saved_work(log, work)
b0 = B.prefill_bound(log, cap, work).work
bf = B.prefill_bound(log, cap, work, prefill_stores=True).work
llog = [dataclasses.replace(a, done_s=a.lookup_s + 1e-9) for a in log]
bl = B.prefill_bound(llog, cap, work).work
import numpy as np
pf = np.array([a.first_token_s - a.lookup_s for a in log if a.first_token_s >= 0])
dc = np.array([a.done_s - a.first_token_s for a in log if a.first_token_s >= 0])
print(f"saved/bound {saved/b0:.3f}  F {bf/b0:.3f}  L(lookup-timed, not valid) {bl/b0:.3f}  saved/L {saved/bl:.3f}")
print("prefill durations p50/p90", np.percentile(pf, [50, 90]), "decode", np.percentile(dc, [50, 90]), "cap blocks", cap)
