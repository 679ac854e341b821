"""How much of this machine's CPU is the engine's: the CPUs it may run on, and what else ran on them meanwhile.

``os.cpu_count()`` counts the machine's CPUs, not this process's: a container limited by a CPU quota, or a
process pinned to a few cores, that starts one thread per CPU of the machine runs more threads than it has CPU
time for, and every barrier of a parallel step then waits for a thread that is not running. So the engine's
thread count comes from ``usable_cpus``: the affinity mask, cut to the cgroup's quota (v2 or v1).

A benchmark on a machine that something else keeps busy measures that machine, not the engine; ``CpuMeter``
tells it so: the CPU time every process used on this process's CPUs (/proc/stat) less this process's own.
No torch here: the command line reads it before anything heavy loads.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
PROC_STAT = Path("/proc/stat")
LOADAVG = Path("/proc/loadavg")
# other processes using more than this share of our CPUs, on average over a run, make its figures "busy"
BUSY_SHARE = 0.10


def usable_cpus(cgroup: Path = CGROUP) -> int:
    """The CPUs this process may use: its affinity mask, at most its cgroup's CPU quota (rounded up)."""
    cpus = len(_affinity())
    quota = cgroup_quota(cgroup)
    return max(1, min(cpus, math.ceil(quota)) if quota is not None else cpus)


def cgroup_quota(cgroup: Path = CGROUP) -> float | None:
    """The cgroup's CPU quota in CPUs (cgroup v2's cpu.max, else v1's cfs quota over its period); None: none."""
    try:
        v2 = cgroup / "cpu.max"
        if v2.is_file():
            quota, _, period = v2.read_text().strip().partition(" ")
            return None if quota == "max" else int(quota) / int(period or 100_000)
        v1 = cgroup / "cpu" / "cpu.cfs_quota_us", cgroup / "cpu" / "cpu.cfs_period_us"
        if v1[0].is_file() and v1[1].is_file():
            quota_us, period_us = int(v1[0].read_text()), int(v1[1].read_text())
            return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        pass
    return None


def busy_now(loadavg: Path = LOADAVG) -> bool:
    """Whether more tasks wanted to run than this process has CPUs, on average over the last minute (the load
    average, read in one go: the process decides at its start, before torch loads)."""
    try:
        return float(loadavg.read_text().split()[0]) > usable_cpus()
    except (OSError, ValueError, IndexError):
        return False


def engine_threads(requested: int | None, ranks: int, current: int) -> int:
    """The threads one of ``ranks`` engine processes computes on: ``requested`` shared out among the ranks, else
    the usable CPUs shared out, at most ``current`` (torch's count: OMP_NUM_THREADS, or what the process set)."""
    if requested is not None:
        return max(1, requested // ranks)
    return max(1, min(usable_cpus() // ranks, current))


@dataclass(frozen=True)
class CpuTimes:
    """A reading of the CPU seconds spent so far: by everyone on our CPUs, and by this process."""

    at: float  # time.perf_counter()
    everyone_s: float | None  # None: /proc/stat cannot be read here
    own_s: float

    @classmethod
    def now(cls, stat: Path = PROC_STAT) -> "CpuTimes":
        own = os.times()
        return cls(time.perf_counter(), _busy_seconds(stat), own.user + own.system)


def _affinity() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def _busy_seconds(stat: Path) -> float | None:
    """Non-idle CPU seconds on this process's CPUs since boot: user, nice, system, irq, softirq and steal (a
    virtual machine's neighbours take that)."""
    try:
        mine = _affinity()
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for line in stat.read_text().splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in mine:
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
                total += user + nice + system + irq + softirq + steal
        return total / tick
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class OtherLoad:
    """What other processes used of this process's CPUs over a stretch of time, in CPUs on average."""

    cpus: float
    of: int  # the CPUs this process may run on (its affinity mask)

    @property
    def busy(self) -> bool:
        return self.cpus > BUSY_SHARE * self.of

    def words(self) -> str:
        return f"other processes used {self.cpus:.1f} of {self.of} CPUs"


def other_load(start: CpuTimes, end: CpuTimes) -> OtherLoad | None:
    """Other processes' CPU use between two readings; None where /proc/stat cannot be read."""
    wall = end.at - start.at
    if start.everyone_s is None or end.everyone_s is None or wall <= 0:
        return None
    others = (end.everyone_s - start.everyone_s) - (end.own_s - start.own_s)
    return OtherLoad(max(0.0, others / wall), len(_affinity()))
