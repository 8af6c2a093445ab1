"""Real Redis topologies on one machine: a Sentinel group and a small Cluster.

What the failover tests and ``tenure bench soak`` run: ``redis-server`` processes (Sentinel is
``redis-server --sentinel``, so only the Debian ``redis-server`` package is needed), bound to
127.0.0.1 on free ports, each in its own directory under ``workdir``, stopped by ``stop()``.

* :class:`SentinelGroup`: one master, one replica, three Sentinels (quorum 2) watching master
  ``name``; ``kill_master()`` kills it abruptly and ``wait_failover()`` returns the promoted one.
* :class:`ClusterGroup`: three masters (no replicas) joined with ``redis-cli --cluster create``.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tenure.service.processes import (
    ManagedProcess,
    StackError,
    free_port,
    redis_argv,
    redis_ping,
    require_redis,
)

__all__ = ["ClusterGroup", "RedisNode", "SentinelGroup", "redis_command"]


def redis_command(port: int, *args: str, timeout: float = 2.0) -> str:
    """One command over RESP (inline), its raw reply as text; '' if the server is not there."""
    payload = b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args
    )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(payload)
            chunks = []
            sock.settimeout(timeout)
            while True:
                chunk = sock.recv(65536)
                chunks.append(chunk)
                data = b"".join(chunks)
                if not chunk or _complete(data):
                    return data.decode(errors="replace")
    except OSError:
        return ""


def _complete(data: bytes) -> bool:
    if data[:1] in (b"+", b"-", b":"):
        return data.endswith(b"\r\n")
    if data[:1] == b"$":
        head, _, rest = data.partition(b"\r\n")
        size = int(head[1:])
        return size < 0 or len(rest) >= size + 2
    # Arrays (sentinel replies): good enough for the short replies read here.
    return data.endswith(b"\r\n")


class RedisNode:
    """One ``redis-server`` (data node or Sentinel) with its own directory and log."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        args: list[str],
        *,
        port: int = 0,
        sentinel_config: Path | None = None,
    ) -> None:
        self.name = name
        self.port = port or free_port()
        self.directory = workdir / f"{name}-{self.port}"
        self.directory.mkdir(parents=True, exist_ok=True)
        #: Directives beyond :func:`~tenure.service.processes.redis_argv`'s (replication, cluster).
        self.args = args
        self.sentinel_config = sentinel_config
        self.process: ManagedProcess | None = None

    def argv(self) -> list[str]:
        return redis_argv(
            require_redis(),
            self.port,
            self.directory,
            sentinel_config=self.sentinel_config,
            extra=self.args,
        )

    def start(self, timeout: float = 15.0) -> RedisNode:
        if self.running:
            return self
        self.process = ManagedProcess(self.name, self.argv(), self.directory / "log").start()
        self.process.wait_until(lambda: redis_ping(self.port), timeout)
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running

    @property
    def pid(self) -> int | None:
        if self.process is None or self.process.process is None:
            return None
        return self.process.process.pid

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None:
            self.process.stop(kill=True)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=5)


class SentinelGroup:
    """Master + replica + three Sentinels; the master's address changes on failover."""

    def __init__(
        self,
        workdir: Path,
        *,
        name: str = "tenure",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
    ) -> None:
        self.workdir = workdir
        self.name = name
        self.nodes = [RedisNode("redis-a", workdir, []), RedisNode("redis-b", workdir, [])]
        self.nodes[1].args = ["--replicaof", "127.0.0.1", str(self.nodes[0].port)]
        self.sentinels: list[RedisNode] = []
        for i in range(3):
            port = free_port()
            conf = workdir / f"sentinel-{i}-{port}.conf"
            conf.parent.mkdir(parents=True, exist_ok=True)
            # Sentinel rewrites its config file as it learns the topology: one file each.
            conf.write_text(
                f"sentinel monitor {name} 127.0.0.1 {self.nodes[0].port} 2\n"
                f"sentinel down-after-milliseconds {name} {down_after_ms}\n"
                f"sentinel failover-timeout {name} {failover_timeout_ms}\n"
                f"sentinel parallel-syncs {name} 1\n"
            )
            self.sentinels.append(
                RedisNode(f"sentinel-{i}", workdir, [], port=port, sentinel_config=conf)
            )

    @property
    def sentinel_addresses(self) -> str:
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def start(self) -> SentinelGroup:
        try:
            for node in self.nodes:
                node.start()
            for sentinel in self.sentinels:
                sentinel.start()
            self.wait_replicated(timeout=20)
            self._wait(
                lambda: all(self._sentinel_sees_replica(s) for s in self.sentinels),
                20,
                "sentinels to see the replica",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _sentinel_sees_replica(self, sentinel: RedisNode) -> bool:
        reply = redis_command(sentinel.port, "SENTINEL", "REPLICAS", self.name)
        return "slave" in reply and "s_down" not in reply

    def master_port(self) -> int | None:
        """The master's port as a majority of Sentinels report it."""
        votes: dict[int, int] = {}
        for sentinel in self.sentinels:
            reply = redis_command(sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
            lines = reply.split("\r\n")
            if len(lines) >= 5 and lines[4].isdigit():
                port = int(lines[4])
                votes[port] = votes.get(port, 0) + 1
        if not votes:
            return None
        port, count = max(votes.items(), key=lambda item: item[1])
        return port if count >= 2 else None

    def master(self) -> RedisNode:
        port = self.master_port()
        for node in self.nodes:
            if node.port == port:
                return node
        raise StackError("no master known to the sentinels")

    def replica(self) -> RedisNode:
        master = self.master()
        return next(node for node in self.nodes if node is not master)

    def wait_replicated(self, timeout: float = 10.0) -> None:
        """Until the master reports a connected replica at its own replication offset."""

        def caught_up() -> bool:
            info = redis_command(
                self.master().port if self.master_port() else self.nodes[0].port,
                "INFO",
                "replication",
            )
            fields = dict(
                line.split(":", 1)
                for line in info.split("\r\n")
                if ":" in line and not line.startswith("$")
            )
            if fields.get("connected_slaves", "0") == "0":
                return False
            offset = fields.get("master_repl_offset", "")
            return any(
                f"offset={offset}," in value and "state=online" in value
                for key, value in fields.items()
                if key.startswith("slave")
            )

        self._wait(caught_up, timeout, "the replica to catch up")

    def replicated_through_now(self, timeout: float = 30.0) -> None:
        """Until the replica has acknowledged every write the master had taken when this was
        called (its offset reaches the master's offset read now; writes may go on meanwhile,
        unlike :meth:`wait_replicated`, which needs the two offsets to meet)."""
        master = self.master().port

        def fields() -> dict[str, str]:
            info = redis_command(master, "INFO", "replication")
            return dict(
                line.split(":", 1)
                for line in info.split("\r\n")
                if ":" in line and not line.startswith("$")
            )

        target = int(fields()["master_repl_offset"])

        def reached() -> bool:
            for key, value in fields().items():
                if key.startswith("slave") and "state=online" in value:
                    parts = dict(item.split("=", 1) for item in value.split(",") if "=" in item)
                    if int(parts.get("offset", "-1")) >= target:
                        return True
            return False

        self._wait(reached, timeout, "the replica to acknowledge the master's writes so far")

    def kill_master(self) -> RedisNode:
        master = self.master()
        master.kill()
        return master

    def wait_failover(self, old: RedisNode, timeout: float = 30.0) -> RedisNode:
        """Until the Sentinels name another master and it accepts writes; that master."""

        def promoted() -> bool:
            port = self.master_port()
            if port is None or port == old.port:
                return False
            return "role:master" in redis_command(port, "INFO", "replication")

        self._wait(promoted, timeout, "the sentinels to promote the replica")
        return self.master()

    def restart(self, node: RedisNode) -> None:
        """Start a killed node again as a replica of the current master (Sentinel would
        reconfigure it too; saying so at once avoids it accepting writes meanwhile)."""
        master = self.master()
        node.args = ["--replicaof", "127.0.0.1", str(master.port)]
        node.start()

    @staticmethod
    def _wait(predicate: object, timeout: float, what: str) -> None:
        assert callable(predicate)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise StackError(f"timed out after {timeout:.0f}s waiting for {what}")

    def stop(self) -> None:
        for node in [*self.sentinels, *self.nodes]:
            with contextlib.suppress(Exception):
                node.stop()

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ClusterGroup:
    """Three cluster masters (no replicas), slots spread by ``redis-cli --cluster create``."""

    def __init__(self, workdir: Path, *, masters: int = 3) -> None:
        self.workdir = workdir
        self.nodes = []
        for i in range(masters):
            port = free_port()
            args = [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(workdir / f"nodes-{port}.conf"),
                "--cluster-node-timeout", "2000",
                # The bus defaults to port + 10000, which fails above 55535: pick one free.
                "--cluster-port", str(free_port()),
            ]  # fmt: skip
            self.nodes.append(RedisNode(f"cluster-{i}", workdir, args, port=port))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> ClusterGroup:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise StackError("redis-cli not found on PATH (Debian: apt-get install redis-tools)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *addresses,
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            SentinelGroup._wait(
                lambda: all(
                    "cluster_state:ok" in redis_command(node.port, "CLUSTER", "INFO")
                    for node in self.nodes
                ),
                30,
                "the cluster to be ok",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()

    def __enter__(self) -> ClusterGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
