"""CPU placement for the process benchmarks: pinning, idle-CPU spinners, CPU time per process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["awake_cpus", "cpu_seconds", "placement"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux ``/proc``); NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_SPIN = """
import contextlib, os
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
# With autogroups on, a new session is a scheduling group that competes at full weight
# whatever its tasks' policy: give the group the lowest weight as well.
with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
    f.write("19")
while True:
    pass
"""


@contextmanager
def awake_cpus(enabled: bool) -> Iterator[None]:
    """One lowest-priority (SCHED_IDLE) spinner per CPU, so no vCPU ever halts.

    On a VM an idle vCPU halts, and waking it for the next packet costs a trip through the
    hypervisor (tens to hundreds of microseconds, more under steal): a ping-pong benchmark pays
    it at every hop. The spinners yield to any runnable process at once; they are what
    ``idle=poll`` would do, and tell the VM's wake-up cost apart from the proxy's own.
    """
    if not enabled or not hasattr(os, "SCHED_IDLE"):
        yield
        return
    spinners = []
    try:
        for cpu in sorted(os.sched_getaffinity(0)):
            spinner = subprocess.Popen([sys.executable, "-c", _SPIN], start_new_session=True)
            os.sched_setaffinity(spinner.pid, {cpu})
            spinners.append(spinner)
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def placement(pin: bool) -> tuple[set[int], set[int]] | None:
    """(CPUs for the sidecar and Redis, CPUs for the rest), or None to let the kernel place."""
    if not pin or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return {cpus[-1]}, set(cpus[:-1])
