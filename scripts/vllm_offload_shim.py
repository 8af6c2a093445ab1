"""pytest plugin: vLLM's own offloading tests with a Tenure policy wherever they ask for lru/arc.

Loaded by ``scripts/run_vllm_offload_tests.sh`` (``-p vllm_offload_shim``); it contains no vLLM
code and fetches nothing. Environment:

* ``TENURE_VLLM_POLICY``: the registered ``eviction_policy`` name every ``lru`` / ``arc``
  manager of the tests is built with (``none``: leave vLLM's policies in place, a baseline);
* ``TENURE_VLLM_MANAGER``: ``stock`` (vLLM's ``CPUOffloadingManager``) or ``tenure``
  (``engine_adapter``'s ``TenureOffloadingManager`` in its place);
* ``TENURE_VLLM_RESULTS``: a JSON-lines file, one line per test;
* ``TENURE_VLLM_CONTRACT``: ``0`` skips the contract checks (for a reference run routed to
  vLLM's own ``arc``: which victims does vLLM's ARC choose in an LRU test).

Every routed manager is wrapped by :func:`tenure.engine_adapter.testing.contract.instrument`, so a
contract breach (an overrun, a protected key evicted, a non-atomic evict, books that disagree
with vLLM's) fails the test with ``ContractViolation`` even where the test itself would not
notice. Each result line says where a failure was raised (the test's own assertion, or library
code), so the summary can tell a policy difference from a crash.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

import pytest

POLICY = os.environ.get("TENURE_VLLM_POLICY", "none")
MANAGER = os.environ.get("TENURE_VLLM_MANAGER", "stock")
RESULTS = os.environ.get("TENURE_VLLM_RESULTS")
#: 1 (default): tests that check ``isinstance(policy, LRUCachePolicy / ARCCachePolicy)`` go on
#: past that check, so their calls still run under the contract checks until they read a
#: vLLM-internal attribute (reported as such).
WHITEBOX = os.environ.get("TENURE_VLLM_WHITEBOX", "1") == "1"
#: 0: no contract checks, only the comparison with vLLM's policy. For a reference run that
#: routes to one of vLLM's own policies (``TENURE_VLLM_POLICY=arc``), which lacks the books
#: (``chunks``) the checker reads.
CONTRACT = os.environ.get("TENURE_VLLM_CONTRACT", "1") == "1"
_BUILTINS = ("lru", "arc")

_managers: list[Any] = []


def pytest_configure(config: pytest.Config) -> None:
    import vllm.v1.kv_offload.cpu.manager as cpu_manager

    from tenure.engine_adapter.manager import TenureOffloadingManager
    from tenure.engine_adapter.plugin import register
    from tenure.engine_adapter.testing.contract import instrument

    register()
    if POLICY != "none" and WHITEBOX:
        from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
        from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

        from tenure.engine_adapter.policy import TenureCachePolicy

        LRUCachePolicy.register(TenureCachePolicy)
        ARCCachePolicy.register(TenureCachePolicy)
    stock = cpu_manager.CPUOffloadingManager
    stock_init = stock.__init__
    shadowing = False

    def routed_init(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal shadowing
        args_list = list(args)
        asked = args_list[1] if len(args_list) >= 2 else kwargs.get("cache_policy", "lru")
        routed = POLICY if POLICY != "none" and asked in _BUILTINS and not shadowing else asked
        if len(args_list) >= 2:
            args_list[1] = routed
        else:
            kwargs["cache_policy"] = routed
        stock_init(self, *args_list, **kwargs)
        if routed == asked:
            return
        if CONTRACT:
            instrument(self)
        # vLLM's own manager and policy, fed the same calls: where the two first part ways
        # is the reason a test expecting vLLM's behaviour fails.
        shadowing = True
        try:
            twin = stock(*args_list[:1], **{**kwargs, "cache_policy": asked})
        finally:
            shadowing = False
        _shadow(self, twin)
        _managers.append(self)

    stock.__init__ = routed_init  # type: ignore[method-assign]
    if MANAGER == "tenure":
        # Test modules import the name at collection time: they get Tenure's manager.
        cpu_manager.CPUOffloadingManager = TenureOffloadingManager  # type: ignore[misc]


def _twin_ctx(twins: dict[int, tuple[Any, Any]], ctx: Any) -> Any:
    from vllm.v1.kv_offload.base import ReqContext

    from tenure.engine_adapter.vllm_compat import offload_key_positions

    entry = twins.get(id(ctx))
    if entry is None or entry[0] is not ctx:
        twin = ReqContext(req_id=ctx.req_id, kv_transfer_params=ctx.kv_transfer_params)
        entry = twins[id(ctx)] = (ctx, twin)
    twin = entry[1]
    for key, end in offload_key_positions(ctx).items():
        twin.set_offload_key_position(key, end)
    return twin


def _summary(name: str, out: Any) -> Any:
    if name == "prepare_store":
        if out is None:
            return None
        return {"store": list(out.keys_to_store), "evicted": list(out.evicted_keys)}
    if name == "lookup":
        return out.name
    return None


def _shadow(manager: Any, twin: Any) -> None:
    """Mirror the manager calls onto ``twin``; record the first call where the results differ."""
    from tenure.engine_adapter.testing.contract import MANAGER_CALLS

    manager.divergence = None
    twins: dict[int, tuple[Any, Any]] = {}
    calls = {"n": 0, "depth": 0}

    def mirrored(name: str, call: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            from vllm.v1.kv_offload.base import ReqContext

            twin_args = [_twin_ctx(twins, a) if isinstance(a, ReqContext) else a for a in args]
            twin_kwargs = {
                k: _twin_ctx(twins, v) if isinstance(v, ReqContext) else v
                for k, v in kwargs.items()
            }
            try:
                theirs: Any = _summary(name, getattr(twin, name)(*twin_args, **twin_kwargs))
            except Exception as exc:  # the twin is only a reference: never fail the test here
                theirs = f"raised {type(exc).__name__}"
            calls["depth"] += 1
            try:
                out = call(*args, **kwargs)
            finally:
                calls["depth"] -= 1
            ours = _summary(name, out)
            if manager.divergence is None and ours != theirs:
                manager.divergence = _describe(calls["n"], name, ours, theirs)
            return out

        return wrapper

    for name in MANAGER_CALLS:
        setattr(manager, name, mirrored(name, getattr(manager, name)))
    evict = manager._policy.evict

    def direct_evict(n: int, protected: set[Any]) -> Any:
        # A test calling the policy's evict() itself (not through prepare_store): mirror it.
        if calls["depth"]:
            return evict(n, protected)
        calls["n"] += 1
        theirs = twin._policy.evict(n, set(protected))
        out = evict(n, protected)
        if manager.divergence is None and (out is None) != (theirs is None):
            kind = "refusal" if out is None else "admitted where vLLM refused"
            manager.divergence = {
                "call": calls["n"],
                "kind": f"{kind} (direct evict)",
                "ours": str(out is not None),
                "theirs": str(theirs is not None),
            }
        return out

    manager._policy.evict = direct_evict


def _describe(n: int, name: str, ours: Any, theirs: Any) -> dict[str, Any]:
    if name == "prepare_store" and ours is None:
        kind = "refusal"
    elif name == "prepare_store" and theirs is None:
        kind = "admitted where vLLM refused"
    elif name == "prepare_store" and ours["store"] != theirs["store"]:
        kind = "different store"
    elif name == "prepare_store":
        kind = "different victim"
    elif name == "lookup":
        kind = "different lookup"
    else:
        kind = f"different {name}"
    return {"call": n, "kind": kind, "ours": _short(ours), "theirs": _short(theirs)}


def _short(value: Any) -> str:
    def name(key: Any) -> str:
        raw = bytes(key[:-4]).rstrip(b"\0")
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return raw.hex()[:8]

    if isinstance(value, dict):
        stored = [name(k) for k in value["store"]]
        return f"store {stored} evict {[name(k) for k in value['evicted']]}"
    return str(value)


def _origin(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """Where the failure was raised: ``test`` (the test's own assert) or a library file."""
    frames = traceback.extract_tb(excinfo.tb)
    if not frames:
        return "unknown"
    path = Path(frames[-1].filename)
    if path.name.startswith("test_") or "_pytest" in path.parts:
        return "test"  # the test's own assert, or pytest.raises / pytest.fail on its behalf
    parts = path.parts
    for root in ("vllm", "engine_adapter", "service"):
        if root in parts:
            return "/".join(parts[parts.index(root) :])
    return path.name


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if report.when == "setup" and report.passed:
        _managers.clear()
        return
    if report.when != "call" and not (report.when == "setup" and report.failed):
        return
    from tenure.engine_adapter.testing.contract import ContractViolation

    violations = [v for m in _managers for v in getattr(m, "contract_violations", [])]
    line: dict[str, Any] = {
        "test": item.nodeid.split("::", 1)[-1],
        "file": Path(str(item.fspath)).name,
        "policy": POLICY,
        "manager": MANAGER,
        "outcome": report.outcome,
        "routed_managers": len(_managers),
        "violations": violations,
        "divergence": next(
            (m.divergence for m in _managers if getattr(m, "divergence", None)), None
        ),
    }
    if call.excinfo is not None:
        exc = call.excinfo.value
        line["error"] = type(exc).__name__
        line["violation"] = isinstance(exc, ContractViolation)
        line["origin"] = _origin(call.excinfo)
        line["message"] = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    if RESULTS:
        with open(RESULTS, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
