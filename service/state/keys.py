"""Every Redis key the sidecar uses, built in one place under one prefix.

Layout (``P`` = the configured prefix, ``T`` = tenant, ``S`` = session id within the tenant):

* ``P:s:T:S``         hash: one session's lifecycle record
* ``P:live:T``        sorted set: the tenant's live sessions scored by expected wake-up
* ``P:px:T:H``        string: session that sent a request whose message list hashes to ``H``
                      (session inference for clients that send no session header)
* ``P:gapobs:T``      list: observed gaps ``class|tools|seconds``, newest first, bounded
* ``P:decisions``     stream: every decision with its reason, bounded
* ``P:dseq``          counter: sequence number of the newest decision
* ``P:dtable``        hash: tenant-scoped session id -> newest decision (the push snapshot)
* ``P:dgc``           sorted set: decision-table entries scored by when they may be dropped
* ``P:waits``         list: observed suspension waits (seconds), newest first, bounded
* ``P:calwaits``      list: the calibration sample posted to ``POST /admin/waits``, bounded
* ``P:suspends``      list: Unix times of recent suspensions (the lambda estimate), bounded
* ``P:config``        string: runtime configuration (JSON) set through ``/admin/config``
* ``P:seg:T:S``       string: one session's segment bookkeeping (JSON, bounded; see
                      :mod:`tenure.service.state.segment_store`)
* ``P:engines``       hash: engine id -> its newest residency summary (JSON), for
                      ``/admin/engines`` on every replica (ids are bounded labels)
* ``P:emoves``        hash: engine id -> sessions that moved to it (cold arrivals)

On Redis Cluster every script touches the global keys (``dseq``, ``decisions``, ``dtable``)
beside a tenant's, so all keys of a deployment must share one hash slot: the root is then the
prefix in braces (``{tenure}:s:T:S``, see :meth:`Keys.build`). The decision sequence is one
total order that the push channel relies on, so the keys are not spread across slots; a
Cluster gives this deployment failover and lets several deployments (prefixes) share the
cluster's masters. Hash-tagged names differ from plain ones: turning the tag on for an existing
Redis needs ``tenure state migrate-keys`` (:mod:`tenure.service.state.migrate`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Keys", "scoped_session_id"]


def scoped_session_id(tenant: str, session: str) -> str:
    """The id that leaves the sidecar (push channel, ``kv_transfer_params``): tenant-scoped.

    Session ids cannot contain ``/``, so the scoped form is unambiguous.
    """
    return f"{tenant}/{session}"


@dataclass(frozen=True, slots=True)
class Keys:
    #: The root every key starts with: the configured prefix, in braces when hash-tagged.
    prefix: str

    @classmethod
    def build(cls, prefix: str, *, hash_tag: bool = False) -> Keys:
        """Keys under ``prefix``; ``hash_tag`` puts them all in one Redis Cluster slot."""
        if "{" in prefix or "}" in prefix:
            raise ValueError("the key prefix cannot contain braces (the hash tag adds them)")
        return cls(f"{{{prefix}}}" if hash_tag else prefix)

    @property
    def hash_tagged(self) -> bool:
        return self.prefix.startswith("{") and self.prefix.endswith("}")

    def session(self, tenant: str, session: str) -> str:
        return f"{self.prefix}:s:{tenant}:{session}"

    def live(self, tenant: str) -> str:
        return f"{self.prefix}:live:{tenant}"

    def segments(self, tenant: str, session: str) -> str:
        return f"{self.prefix}:seg:{tenant}:{session}"

    def segment_workers(self, tenant: str, session: str) -> str:
        """A parent session's worker counters (:mod:`tenure.service.state.segment_store`)."""
        return f"{self.prefix}:segw:{tenant}:{session}"

    def prefix_hash(self, tenant: str, digest: str) -> str:
        return f"{self.prefix}:px:{tenant}:{digest}"

    def gap_observations(self, tenant: str) -> str:
        return f"{self.prefix}:gapobs:{tenant}"

    @property
    def decisions(self) -> str:
        return f"{self.prefix}:decisions"

    @property
    def decision_seq(self) -> str:
        return f"{self.prefix}:dseq"

    @property
    def decision_table(self) -> str:
        return f"{self.prefix}:dtable"

    @property
    def decision_gc(self) -> str:
        return f"{self.prefix}:dgc"

    @property
    def waits(self) -> str:
        return f"{self.prefix}:waits"

    @property
    def calibration_waits(self) -> str:
        """The SRE's calibration sample (``POST /admin/waits``): never a tenant's own waits."""
        return f"{self.prefix}:calwaits"

    @property
    def suspensions(self) -> str:
        return f"{self.prefix}:suspends"

    @property
    def config(self) -> str:
        return f"{self.prefix}:config"

    @property
    def engines(self) -> str:
        return f"{self.prefix}:engines"

    @property
    def engine_moves(self) -> str:
        return f"{self.prefix}:emoves"
