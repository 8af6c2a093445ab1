"""Summarise ``scripts/run_vllm_offload_tests.sh`` results: one outcome per (test, manager, policy).

Each result line (written by ``scripts/vllm_offload_shim.py``) is classified:

* ``pass``;
* ``VIOLATION``: a contract check failed (overrun, protected key evicted, non-atomic evict,
  books that disagree with vLLM's) — must never happen;
* ``CRASH``: an exception raised outside the test's own code (engine_adapter, service, vLLM) —
  must never happen;
* ``white-box``: the test reads vLLM's ``LRUCachePolicy`` / ``ARCCachePolicy`` internals
  (``t1``, ``b1``, ``target_t1_size``, ``_heap``...), which another policy does not have;
  every call it made before that ran under the contract checks;
* a policy difference, named by where the policy first parted from vLLM's own (the shim runs
  vLLM's manager with the policy the test asked for beside it, same calls): ``refusal`` (the
  policy refused a store vLLM's policy made), ``different victim``, ``admitted where vLLM
  refused``, ``different lookup``.

Usage: ``python scripts/vllm_offload_summary.py RESULTS.jsonl [--csv OUT.csv] > summary.md``.
Exit status 1 if any VIOLATION or CRASH (or a test failed without a recorded reason).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter, defaultdict
from typing import Any

WHITE_BOX_ATTRS = ("t1", "t2", "b1", "b2", "target_t1_size", "_heap", "_ranks", "_evictable")
KINDS = ["pass", "refusal", "different victim", "white-box", "other difference"]


def classify(row: dict[str, Any]) -> tuple[str, str]:
    """(outcome, detail) for one result line."""
    if row["violations"] or row.get("violation"):
        return "VIOLATION", "; ".join(row["violations"]) or row.get("message", "")
    if row["outcome"] == "passed":
        return "pass", ""
    if row.get("origin") != "test" and row.get("error") != "Failed":  # Failed: pytest.raises
        return "CRASH", f"{row.get('error')} in {row.get('origin')}: {row.get('message', '')}"
    message = row.get("message", "")
    divergence = row.get("divergence")
    if row.get("error") == "AttributeError" and any(
        f"attribute '{attr}'" in message for attr in WHITE_BOX_ATTRS
    ):
        return "white-box", message
    if divergence is None:
        return "UNEXPLAINED", f"{row.get('error')}: {message}"
    kind = divergence["kind"].replace(" (direct evict)", "")
    detail = (
        f"call {divergence['call']}: {divergence['kind']}; policy: {divergence['ours']}; "
        f"vLLM's: {divergence['theirs']}"
    )
    if kind in ("refusal", "different victim"):
        return kind, detail
    return "other difference", detail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--csv", help="also write one row per (test, manager, policy)")
    args = parser.parse_args(argv)
    with open(args.results, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    baseline = [r for r in rows if r["policy"] == "none"]
    routed = [r for r in rows if r["policy"] != "none"]
    managers = sorted({r["manager"] for r in routed}, key=lambda m: m != "stock")
    policies = sorted({r["policy"] for r in routed})
    table: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    details: dict[tuple[str, str], list[tuple[str, str, str]]] = defaultdict(list)
    bad: list[str] = []
    out_rows = []
    for row in routed:
        outcome, detail = classify(row)
        table[(row["policy"], row["manager"])][outcome] += 1
        test = f"{row['file']}::{row['test']}"
        out_rows.append([test, row["manager"], row["policy"], outcome, detail])
        if outcome in ("VIOLATION", "CRASH", "UNEXPLAINED"):
            bad.append(f"{row['manager']} {row['policy']} {test}: {outcome}: {detail}")
        elif outcome not in ("pass", "white-box"):
            details[(test, outcome)].append((row["manager"], row["policy"], detail))

    w = sys.stdout.write
    tests = len({(r["file"], r["test"]) for r in routed})
    w(f"vLLM's offloading tests: {tests} tests x {len(policies)} policies x ")
    w(f"{len(managers)} managers = {len(routed)} runs\n\n")
    if baseline:
        passed = sum(1 for r in baseline if r["outcome"] == "passed")
        w(f"Baseline (vLLM's own lru/arc, no routing): {passed} of {len(baseline)} passed.\n\n")
    w("| policy | manager | " + " | ".join(KINDS) + " | violation / crash |\n")
    w("|---|---|" + "---|" * (len(KINDS) + 1) + "\n")
    for policy in policies:
        for manager in managers:
            c = table[(policy, manager)]
            cells = [str(c[k]) for k in KINDS]
            worst = c["VIOLATION"] + c["CRASH"] + c["UNEXPLAINED"]
            w(f"| `{policy}` | {manager} | " + " | ".join(cells) + f" | {worst} |\n")
    w("\nPolicy differences, by test (the first call where the policy parted from vLLM's):\n\n")
    for (test, outcome), items in sorted(details.items()):
        who = sorted({f"{p} ({m})" for m, p, _ in items})
        w(f"- `{test}` — **{outcome}** under {len(items)} runs: {', '.join(who)}\n")
        examples: dict[str, str] = {}
        for manager, policy, detail in sorted(items, key=lambda i: (i[1] == "notier", i)):
            examples.setdefault(detail, f"{policy} ({manager})")
        for detail, where in list(examples.items())[:2]:
            w(f"  - e.g. {where}, {detail}\n")
    white = sorted({r[0] for r in out_rows if r[3] == "white-box"})
    w(f"\nWhite-box tests (read vLLM's LRU/ARC internals; {len(white)}):\n\n")
    for test in white:
        w(f"- `{test}`\n")
    if bad:
        w("\n**Violations, crashes, unexplained failures:**\n\n")
        for line in bad:
            w(f"- {line}\n")
    else:
        w("\nNo contract violation, no crash, no unexplained failure.\n")
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["test", "manager", "policy", "outcome", "detail"])
            writer.writerows(sorted(out_rows))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
