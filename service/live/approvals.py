"""``tenure up --approvals``: real human-approval gaps through the live stack, beside the replay.

The retention decision exists for one kind of wait: a session suspended while a human reads,
approves or answers. This plays the Claude Code trace's own human-turn gaps through
``tenure serve`` and a CPU vLLM with the Tenure adapter, and counts where each resume's KV came
from (the adapter's resume report: ``hbm``, ``host`` or ``recomputed``), per retention branch,
beside what the host-tier replay (:func:`tenure.service.replay.ttl_sim.replay_timers`, the
model ``tenure replay ttl`` is built on) predicts for the same episodes.

**The slice.** The trace's human-turn gaps, split by session into a calibration and a held-out
half (:func:`tenure.service.replay.ttl_families.human_turn_gaps`, as ``tenure replay ttl`` does).
Both halves are put in one live time unit: every gap is multiplied by ``w_ref_s / (pooled mean
gap)``, so the mean wait is ``w_ref_s`` live seconds. The calibration half goes to the sidecar,
whole, as the SRE's sample (``POST /admin/waits``); the episodes' waits are drawn from the
held-out half (seeded) and capped at ``max_wait_s`` (a run has to end: at the defaults, 6 x
``w_ref_s``, 2.5% of the held-out gaps are longer; a capped wait frees its host slot early,
which can only help a retained copy's neighbours).

**One episode.** A session's first turn (a ``prompt_words``-token prompt), a suspension
(``POST /v1/sessions/{id}/suspend``, reason ``approval``: the sidecar answers with the branch's
host TTL, or none on ``retain``), the wait, the resume and the second turn (the first turn's
conversation plus a short answer, declared the session's last). Episodes start as a Poisson
stream at ``load x lambda_crit`` of the sidecar's own retention model (``host_slots`` copies,
``w_ref_s``), the load the controller is told (``lambda_mode: fixed``), so the congestion the
model prices is the one the host tier sees. The host tier holds ``host_slots`` first turns.

**The prediction.** The same episodes (their measured suspension times and waits, the TTL the
sidecar answered each with) replayed on ``host_slots`` slots: a copy is admitted if a slot is
free at suspension (residents are never displaced), and served from the host if admitted and
resumed before its timer. The replay has no GPU cache: a live ``hbm`` resume (the engine still
held the prompt, e.g. after a wait shorter than the traffic that would flush it) is counted
apart.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tenure.service.errors import UsageError

__all__ = [
    "ApprovalSpec",
    "Episode",
    "LoadResult",
    "configure_approvals",
    "episode_waits",
    "predict",
    "run_approvals",
]

#: The resume outcomes the adapter reports.
OUTCOMES = ("hbm", "host", "recomputed")
#: Words of a follow-up message (the human's answer after the approval).
_ANSWER_WORDS = 20


@dataclass(frozen=True, slots=True)
class ApprovalSpec:
    trace: Path
    #: Episodes per load.
    episodes: int = 96
    #: Loads, as multiples of the retention model's lambda_crit.
    loads: tuple[float, ...] = (1.0, 3.0)
    #: The mean wait in live seconds after scaling (the model's W_ref).
    w_ref_s: float = 20.0
    #: Cap of one wait, live seconds.
    max_wait_s: float = 120.0
    #: Host copies the tier holds (the model's C2).
    host_slots: int = 6
    prompt_words: int = 300
    seed: int = 0

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise UsageError("--approval-episodes must be >= 1")
        if not self.loads or not all(x > 0 and math.isfinite(x) for x in self.loads):
            raise UsageError("--approval-loads must be positive numbers (x lambda_crit)")
        checks = (("--approval-w-ref-s", self.w_ref_s), ("--max-wait-s", self.max_wait_s))
        for name, value in checks:
            if not (value > 0 and math.isfinite(value)):
                raise UsageError(f"{name} must be a positive number")
        if self.host_slots < 1:
            raise UsageError("--host-slots must be >= 1")


@dataclass(slots=True)
class Episode:
    session: str
    #: Seconds after the load's start: the suspension, and the wait until the resume.
    suspended_at: float = 0.0
    wait_s: float = 0.0
    planned_wait_s: float = 0.0
    #: The sidecar's answer to the suspension (None: retained until resume).
    host_ttl_s: float | None = None
    reason: str = ""
    error: str | None = None


@dataclass(slots=True)
class LoadResult:
    load: float
    lambda_per_s: float
    lambda_crit_per_s: float
    branch_at_start: str
    t2_at_start_s: float | None
    #: The controller's reason for its choice at the start (``/admin/retention``).
    reason_at_start: str = ""
    episodes: list[Episode] = field(default_factory=list)
    #: Adapter resume outcomes per branch (``tenure_resumes_total`` deltas).
    live: dict[str, dict[str, int]] = field(default_factory=dict)
    #: The replay's prediction per branch: ``host`` (admitted, resumed in time) and
    #: ``recomputed`` (expired or never admitted).
    predicted: dict[str, dict[str, int]] = field(default_factory=dict)
    wall_s: float = 0.0
    #: The adapter's own counters over the load (``tenure_adapter_*`` deltas): where the
    #: host tier's room went (stores, refusals, evictions by class, timer expiries).
    adapter: dict[str, float] = field(default_factory=dict)


def episode_waits(
    calibration: np.ndarray, heldout: np.ndarray, spec: ApprovalSpec
) -> tuple[list[float], list[float]]:
    """The calibration sample and ``spec.episodes`` held-out waits, in live seconds."""
    pooled_mean = float(np.concatenate([calibration, heldout]).mean())
    scale = spec.w_ref_s / pooled_mean
    # The calibration sample keeps its whole tail: it is what the rule is chosen on, and the
    # tail is what decides between retain and a timer. Only the played waits are capped.
    cal = calibration * scale
    rng = np.random.default_rng(spec.seed)
    drawn = heldout[rng.integers(0, len(heldout), spec.episodes)] * scale
    # The sidecar keeps the newest CALIBRATION_SAMPLES (1,024) of what is posted, and the
    # half is in trace order (users in file order): shuffled, what it keeps is a random
    # subsample of the whole half rather than its last users.
    cal = cal[rng.permutation(len(cal))][:10_000]
    return [float(x) for x in cal], [float(x) for x in np.minimum(drawn, spec.max_wait_s)]


def predict(episodes: Sequence[Episode], host_slots: int) -> dict[str, dict[str, int]]:
    """The replay's outcome per branch for these episodes (measured times, answered TTLs)."""
    from tenure.service.policy.retention import PriceVector
    from tenure.service.replay.ttl_sim import replay_timers

    done = sorted((e for e in episodes if e.error is None), key=lambda e: e.suspended_at)
    out: dict[str, dict[str, int]] = {}
    if not done:
        return out
    arrivals = np.asarray([e.suspended_at for e in done])
    waits = np.asarray([e.wait_s for e in done])
    ttls = np.asarray([math.inf if e.host_ttl_s is None else e.host_ttl_s for e in done])
    # The price only weighs the costs; the outcomes depend on slots, timers and waits alone.
    result = replay_timers(arrivals, waits, ttls, host_slots, PriceVector(0.0176, 0.02, 1.91))
    served = result.admitted & (waits <= result.ttls)
    for e, host in zip(done, served.tolist(), strict=True):
        row = out.setdefault(_branch(e), {"host": 0, "recomputed": 0})
        row["host" if host else "recomputed"] += 1
    return out


def _branch(e: Episode) -> str:
    """The branch the adapter counts the resume under: ``retain`` only where the controller
    chose it (reason ``regime_retain``); the ttl branch without congestion keeps the copy too
    (``host_retain``, no timer) but is still the ttl branch."""
    return "retain" if e.reason == "regime_retain" else "ttl"


def _resumes(metrics: Mapping[str, float]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    prefix = "tenure_resumes_total{"
    for key, value in metrics.items():
        if not key.startswith(prefix):
            continue
        labels = dict(
            part.split("=", 1) for part in key[len(prefix) : -1].split(",") if "=" in part
        )
        branch = labels.get("branch", "").strip('"')
        outcome = labels.get("outcome", "").strip('"')
        if outcome in OUTCOMES:
            row = out.setdefault(branch, dict.fromkeys(OUTCOMES, 0))
            row[outcome] += int(value)
    return out


def _minus(
    after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for branch, row in after.items():
        was = before.get(branch, {})
        delta = {k: v - was.get(k, 0) for k, v in row.items()}
        if any(delta.values()):
            out[branch] = delta
    return out


def _count(table: Mapping[str, Mapping[str, int]]) -> int:
    return sum(sum(row.values()) for row in table.values())


class _Driver:
    """Plays one load's episodes through a running stack."""

    def __init__(self, stack: Any, spec: ApprovalSpec, say: Callable[[str], None]) -> None:
        self.stack = stack
        self.spec = spec
        self.say = say
        #: Set on the way out (a stop signal, an error): sleeping episodes give up at once.
        self.stop = threading.Event()

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        from tenure.service.processes import http_json

        return http_json(method, f"{self.stack.proxy_url}{path}", body, timeout=120.0)

    def configure(
        self, calibration: list[float], load: float
    ) -> tuple[float, float, Mapping[str, Any]]:
        spec = self.spec
        self.admin("PATCH", "/admin/config", {"host_slots": spec.host_slots,
                   "w_ref_s": spec.w_ref_s, "lambda_mode": "auto"})  # fmt: skip
        crit = float(self._tenant(self.admin("GET", "/admin/retention"))["lambda_crit_per_s"])
        lam = load * crit
        self.admin("PATCH", "/admin/config", {"lambda_mode": "fixed", "lambda_fixed_per_s": lam})
        self.admin("POST", "/admin/waits", {"waits_s": calibration})
        row = self._tenant(self.admin("POST", "/admin/retention/decide?tenant=default"))
        return crit, lam, row

    @staticmethod
    def _tenant(view: Mapping[str, Any]) -> Mapping[str, Any]:
        return next(t for t in view["tenants"] if t["tenant"] == "default")

    def episode(self, e: Episode, start_at: float, t0: float) -> None:
        from tenure.service.tools.tiny_model import word_prompt

        seed = zlib.crc32(e.session.encode())
        try:
            if self.stop.wait(max(0.0, t0 + start_at - time.monotonic())):
                return
            history = [{"role": "user", "content": word_prompt(seed, self.spec.prompt_words)}]
            first = self.stack.chat(history, session=e.session)
            history.append(first["choices"][0]["message"])
            history.append({"role": "user", "content": word_prompt(seed + 1, _ANSWER_WORDS)})
            suspended = self.admin(
                "POST", f"/v1/sessions/{e.session}/suspend", {"reason": "approval"}
            )
            e.suspended_at = time.monotonic() - t0
            e.host_ttl_s = suspended.get("host_ttl_s")
            e.reason = str(suspended.get("reason", ""))
            if self.stop.wait(e.planned_wait_s):
                return
            self.admin("POST", f"/v1/sessions/{e.session}/resume", {})
            e.wait_s = time.monotonic() - t0 - e.suspended_at
            self.stack.chat(history, session=e.session, last_turn=True)
        except Exception as exc:  # one episode's failure is reported, not fatal
            e.error = f"{type(exc).__name__}: {exc}"[:300]

    def play(self, load: float, calibration: list[float], waits: list[float]) -> LoadResult:
        crit, lam, row = self.configure(calibration, load)
        branch, ttl = str(row["branch"]), row["host_ttl_s"]
        t2 = "no timer" if ttl is None else f"t2 {ttl:.1f} s"
        self.say(
            f"load {load:g} x lambda_crit ({lam:.3f} suspensions/s): the rule chose {branch} "
            f"({t2}); {len(waits)} episodes"
        )
        result = LoadResult(load, lam, crit, branch, ttl, str(row.get("reason", "")))
        self.say(f"  its reason: {result.reason_at_start}")
        rng = random.Random(self.spec.seed * 1000 + int(load * 100))
        clock, starts = 0.0, []
        tag = f"ap{int(load * 100)}"
        for i, wait in enumerate(waits):
            clock += rng.expovariate(lam)
            starts.append(clock)
            result.episodes.append(Episode(f"{tag}-{i}", planned_wait_s=wait))
        first = self.stack.sidecar_metrics()
        before = _resumes(first)
        t0 = time.monotonic()
        done = [0]
        lock = threading.Lock()

        def run(e: Episode, at: float) -> None:
            self.episode(e, at, t0)
            with lock:
                done[0] += 1
                if done[0] % max(1, len(waits) // 4) == 0 or done[0] == len(waits):
                    self.say(f"  {done[0]}/{len(waits)} episodes done")

        pool = ThreadPoolExecutor(max_workers=len(waits))
        try:
            for e, at in zip(result.episodes, starts, strict=True):
                pool.submit(run, e, at)
            pool.shutdown(wait=True)
        except BaseException:
            self.stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        expected = sum(1 for e in result.episodes if e.error is None)
        deadline = time.monotonic() + 60.0
        while True:
            last = self.stack.sidecar_metrics()
            result.live = _minus(_resumes(last), before)
            if _count(result.live) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        result.adapter = {
            k: v - first.get(k, 0.0)
            for k, v in last.items()
            if k.startswith("tenure_adapter_") and "_created" not in k and v != first.get(k, 0.0)
        }
        result.wall_s = time.monotonic() - t0
        result.predicted = predict(result.episodes, self.spec.host_slots)
        return result


def configure_approvals(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("the approval slice (--approvals)")
    g.add_argument(
        "--approvals", action="store_true",
        help="play the trace's real human-approval gaps through the live stack and count "
        "resumes served from the host vs recomputed per retention branch, beside the replay",
    )  # fmt: skip
    g.add_argument("--approval-episodes", type=int, default=96, help="episodes per load (96)")
    g.add_argument(
        "--approval-loads", default="1,3", help="loads, x lambda_crit, comma-separated (1,3)"
    )
    g.add_argument(
        "--approval-w-ref-s", type=float, default=20.0,
        help="the mean wait after scaling, live seconds (20)",
    )  # fmt: skip
    g.add_argument("--max-wait-s", type=float, default=120.0, help="cap of one wait, live s (120)")
    g.add_argument("--host-slots", type=int, default=6, help="host copies the tier holds (6)")


def _spec(args: argparse.Namespace) -> ApprovalSpec:
    from tenure.service.replay.paths import claude_code_trace

    try:
        loads = tuple(float(x) for x in str(args.approval_loads).split(",") if x.strip())
    except ValueError:
        raise UsageError(
            f"--approval-loads: expected numbers like 0.5,3, got {args.approval_loads!r}"
        ) from None
    trace = args.trace or claude_code_trace()
    if not Path(trace).is_file():
        raise UsageError(f"--trace: {trace} is not a file")
    return ApprovalSpec(
        trace=Path(trace),
        episodes=args.approval_episodes,
        loads=loads,
        w_ref_s=args.approval_w_ref_s,
        max_wait_s=args.max_wait_s,
        host_slots=args.host_slots,
        seed=args.seed,
    )


def _table(results: Sequence[LoadResult]) -> str:
    lines = [
        "| load | branch | episodes | live host | live recomputed | live hbm | "
        "replay host | replay recomputed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        branches = sorted(set(r.live) | set(r.predicted))
        for b in branches:
            live = r.live.get(b, {})
            pred = r.predicted.get(b, {})
            n = sum(1 for e in r.episodes if e.error is None and _branch(e) == b)
            lines.append(
                f"| {r.load:g} x | {b} | {n} | {live.get('host', 0)} | "
                f"{live.get('recomputed', 0)} | {live.get('hbm', 0)} | {pred.get('host', 0)} | "
                f"{pred.get('recomputed', 0)} |"
            )
    return "\n".join(lines)


def _plot(results: Sequence[LoadResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, live_host, live_hbm, pred_host, live_rec, pred_rec = [], [], [], [], [], []
    for r in results:
        for b in sorted(set(r.live) | set(r.predicted)):
            labels.append(f"{r.load:g}x lambda_crit\n{b} branch")
            live_host.append(r.live.get(b, {}).get("host", 0))
            live_hbm.append(r.live.get(b, {}).get("hbm", 0))
            live_rec.append(r.live.get(b, {}).get("recomputed", 0))
            pred_host.append(r.predicted.get(b, {}).get("host", 0))
            pred_rec.append(r.predicted.get(b, {}).get("recomputed", 0))
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(7, 4))
    w = 0.2
    ax.bar(x - 1.5 * w, live_host, w, label="host, live", color="tab:green")
    ax.bar(
        x - 1.5 * w, live_hbm, w, bottom=live_host, label="GPU cache still held it, live",
        color="tab:blue",
    )  # fmt: skip
    ax.bar(x - 0.5 * w, pred_host, w, label="host, replay (no GPU cache)", color="tab:green",
           alpha=0.45)  # fmt: skip
    ax.bar(x + 0.5 * w, live_rec, w, label="recomputed, live", color="tab:red")
    ax.bar(x + 1.5 * w, pred_rec, w, label="recomputed, replay", color="tab:red", alpha=0.45)
    ax.set_xticks(x, labels)
    ax.set_ylabel("resumes (of the episodes on the branch)")
    ax.set_title("Real approval gaps through the live stack, per retention branch")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_approvals(
    args: argparse.Namespace, cache: Path, workdir: Path | None, say: Callable[[str], None]
) -> int:
    from tenure.service.replay.ttl_families import human_turn_gaps
    from tenure.service.stack import LocalStack, StackConfig

    spec = _spec(args)
    gaps = human_turn_gaps(spec.trace)
    calibration, waits = episode_waits(gaps.calibration, gaps.heldout, spec)
    say(
        f"{len(gaps.calibration)} calibration and {len(gaps.heldout)} held-out human-turn gaps "
        f"from {gaps.sessions} sessions; mean scaled to {spec.w_ref_s:g} live s "
        f"(x {spec.w_ref_s / gaps.raw_mean_s:.4f}), capped at {spec.max_wait_s:g} s"
    )
    own = workdir is None
    root = workdir or Path(tempfile.mkdtemp(prefix="tenure-approvals-"))
    # One first turn (prompt_words tokens) fills this many 128-token blocks of the host tier.
    per_copy = max(1, spec.prompt_words // 128)
    config = StackConfig(
        workdir=root / "stack", model_cache=cache / "models", policy=args.policy,
        host_blocks=spec.host_slots * per_copy,
    )  # fmt: skip
    results: list[LoadResult] = []
    stack = LocalStack(config, progress=say)
    try:
        stack.start()
        driver = _Driver(stack, spec, say)
        for i, load in enumerate(spec.loads):
            if i:
                _fresh_sidecar(stack)
            result = driver.play(load, calibration, waits)
            results.append(result)
            errors = [e.error for e in result.episodes if e.error]
            if errors:
                say(f"  {len(errors)} episodes failed, first: {errors[0]}")
            say(f"  done in {result.wall_s:.0f} s")
    finally:
        stack.stop()
        if own and not args.keep_files:
            shutil.rmtree(root, ignore_errors=True)
    print(_table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"spec": {**asdict(spec), "trace": str(spec.trace)},
               "loads": [asdict(r) for r in results]}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        say(f"wrote {args.json}")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        _plot(results, args.plot)
        say(f"wrote {args.plot}")
    return 0 if all(not e.error for r in results for e in r.episodes) else 1


def _fresh_sidecar(stack: Any) -> None:
    """A new load starts from an empty store: the controller forgets the last load's waits."""
    import redis

    client = redis.Redis.from_url(stack.redis_url)
    try:
        client.flushall()
    finally:
        client.close()
    stack.restart_sidecar(kill=False)
    # The same engine: its adapter says hello to the new sidecar within a hello interval.
    stack.wait_for_adapter()
