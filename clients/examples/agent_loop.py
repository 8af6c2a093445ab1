"""A coding agent's loop through Tenure: tool waits, a sub-agent, an approval gate, a last turn.

Point it at a Tenure sidecar (which fronts vLLM), e.g. the local stack::

    tenure up --keep-running          # Redis + CPU vLLM + sidecar; prints the sidecar URL
    python -m tenure.clients.examples.agent_loop --base-url http://127.0.0.1:8080/v1 --model MODEL

Each step prints what the harness told the sidecar, and the end prints the sidecar's own record
of the session. The hints change nothing in the answers; they decide which KV the engine keeps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Sequence

from openai import OpenAI

from tenure.clients import TenureSession

__all__ = ["main", "run_agent"]


def run_agent(
    client: OpenAI,
    *,
    model: str,
    session_id: str,
    turns: int = 4,
    tool_s: float = 0.5,
    approval_s: float = 1.0,
    max_tokens: int = 16,
) -> dict[str, object]:
    """Run one agent session; returns the sidecar's final record of it."""
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are a coding agent. Answer with one short action."},
        {"role": "user", "content": "The test suite fails in parser.py; fix it."},
    ]
    with TenureSession(client, session_id=session_id, segment="lead") as session:
        for turn in range(turns):
            last = turn == turns - 1
            reply = session.chat(
                model=model,
                messages=messages,
                max_tokens=max_tokens,
                # Tell the sidecar how long until the next call, so the engine keeps this
                # session's KV for about that long; the last turn frees it at once.
                expected_gap_s=None if last else tool_s,
                last_turn=last,
            )
            action = (reply.choices[0].message.content or "").strip()
            messages.append({"role": "assistant", "content": action})
            plan = "last turn" if last else f"tool next, ~{tool_s:g}s"
            print(f"turn {turn}: {plan}: {action[:60]!r}")
            if last:
                break
            if turn == 1:
                # Delegate a review to a sub-agent: a child session whose parent is this one.
                with session.spawn(
                    f"{session_id}.review", role="reviewer", metadata={"task": "review the diff"}
                ) as reviewer:
                    review = reviewer.chat(
                        model=model,
                        messages=[{"role": "user", "content": f"Review this change: {action}"}],
                        max_tokens=max_tokens,
                        last_turn=True,
                    )
                    print(f"  sub-agent {reviewer.session_id} reviewed and finished")
                messages.append(
                    {"role": "user", "content": f"Reviewer: {review.choices[0].message.content}"}
                )
            elif turn == 2:
                # A human must approve: suspend, so the sidecar picks a host-tier TTL for the KV.
                view = session.suspend(reason="human approval", expected_wait_s=approval_s)
                print(f"  suspended for approval, host TTL {view.get('host_ttl_s')!r} s")
                time.sleep(approval_s)
                session.resume()
                print("  approved, resumed")
                messages.append({"role": "user", "content": "Approved. Continue."})
            else:
                time.sleep(tool_s)  # the tool runs
                messages.append({"role": "user", "content": f"Tool output for step {turn}: ok"})
        record = session.info()
    print(f"sidecar record: state={record.get('state')} turns={record.get('turn')}")
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"),
        help="the Tenure sidecar's OpenAI base URL (default: $OPENAI_BASE_URL or %(default)s)",
    )
    parser.add_argument("--model", required=True, help="model name served by vLLM")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tool-s", type=float, default=0.5, help="simulated tool run, seconds")
    parser.add_argument("--approval-s", type=float, default=1.0, help="simulated approval wait")
    parser.add_argument("--session-id", default=None)
    args = parser.parse_args(argv)
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    # The API key selects the tenant on the sidecar; local stacks accept any key.
    client = OpenAI(base_url=args.base_url, api_key=os.environ.get("OPENAI_API_KEY", "local"))
    record = run_agent(
        client,
        model=args.model,
        session_id=args.session_id or f"demo-{uuid.uuid4().hex[:8]}",
        turns=args.turns,
        tool_s=args.tool_s,
        approval_s=args.approval_s,
    )
    return 0 if record.get("state") == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
