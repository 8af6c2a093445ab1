import sys
from collections import Counter
from tenure.service.policy.density import TenureDensity
from tenure.service.replay import engine as eng
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace
why = Counter(); wblocks = Counter()
orig = TenureDensity.select_victims
def sv(self, n, incoming, protected, now):
    r = orig(self, n, incoming, protected, now)
    if r is None:
        if self.refused_already(incoming):
            k = "already refused this request"
        else:
            excluded = self.excluded(incoming, protected)
            res = self.tier.session_resident
            idle = sum(res.get(s, 0) for s in self._idle if s not in excluded) + sum(res.get(s,0) for s in self._finished if s not in excluded)
            active = sum(b for s, b in res.items() if (self.lives.get(s) is not None and self.lives[s].active))
            worth = self._incoming_density(incoming, protected, now)
            if idle < n:
                k = "idle residents too few (active hold %s)" % ("most" if active > self.tier.used/2 else "some")
            else:
                k = "denser residents"
            life = self.lives.get(incoming)
            k += ", incoming gap " + ("none" if life is None or life.expected_gap_s is None else ("<60" if life.expected_gap_s < 60 else ">=60"))
        why[k] += 1; wblocks[k] += n
    return r
TenureDensity.select_victims = sv
trace = load_claude_code(claude_code_trace(), max_roots=200)
res = eng.simulate(trace, ReplayConfig("tenure-density", get_profile("h100-llama3-8b"), 32.0, 0.001, 0))
for k, v in why.most_common(): print(f"{v:6d} {wblocks[k]:9d} {k}")
