"""The CPUs the engine may use (affinity, cgroup quota) and what other processes used of them during a run."""

from __future__ import annotations

import os

import pytest

from core import cpu_share
from core.config import EngineConfig
from core.cpu_share import CpuTimes, cgroup_quota, engine_threads, other_load, usable_cpus
from core.errors import InvalidParamsError

AFFINITY = len(os.sched_getaffinity(0))


def test_a_cgroup_quota_caps_the_usable_cpus(tmp_path):
    assert cgroup_quota(tmp_path) is None and usable_cpus(tmp_path) == AFFINITY  # no cgroup files: the affinity
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # v2: one and a half CPUs
    assert cgroup_quota(tmp_path) == 1.5 and usable_cpus(tmp_path) == min(AFFINITY, 2)
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")  # v1: half a CPU is still one thread
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(tmp_path) == 0.5 and usable_cpus(tmp_path) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")  # v1's "no quota"
    assert cgroup_quota(tmp_path) is None


def test_the_engines_threads_are_asked_for_or_the_usable_cpus_shared_among_ranks(monkeypatch):
    monkeypatch.setattr(cpu_share, "usable_cpus", lambda: 8)
    assert engine_threads(None, 1, current=16) == 8
    assert engine_threads(None, 1, current=4) == 4  # OMP_NUM_THREADS (torch's count) lowers it
    assert engine_threads(None, 3, current=16) == 2
    assert engine_threads(6, 2, current=1) == 3 and engine_threads(1, 4, current=8) == 1
    with pytest.raises(InvalidParamsError, match="threads must be an integer >= 1"):
        EngineConfig(threads=0)


def test_other_processes_cpu_time_is_everyones_less_ours(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    tick = os.sysconf("SC_CLK_TCK")

    def stat(busy_ticks: int) -> CpuTimes:
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"] + [f"cpu{c} {busy_ticks} 0 0 500 0 0 0 0 0 0" for c in cpus]
        (tmp_path / "stat").write_text("\n".join(lines) + "\n")
        return CpuTimes.now(tmp_path / "stat")

    start = stat(0)
    end = CpuTimes(start.at + 2.0, stat(tick).everyone_s, start.own_s + 0.5)  # 1 s on each CPU, 0.5 s ours
    load = other_load(start, end)
    assert load is not None and load.of == len(cpus)
    assert load.cpus == pytest.approx((len(cpus) - 0.5) / 2.0)
    assert load.busy and "of {} CPUs".format(len(cpus)) in load.words()
    assert other_load(start, CpuTimes(end.at, None, end.own_s)) is None  # no /proc/stat: nothing claimed


def test_idle_workers_spin_briefly_on_a_busy_machine_unless_the_user_said_otherwise(monkeypatch, tmp_path):
    from core import env

    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    env.let_idle_threads_sleep(busy=False)
    assert "GOMP_SPINCOUNT" not in os.environ  # an idle machine: libgomp's own spin, the fastest there
    env.let_idle_threads_sleep(busy=True)
    assert os.environ["GOMP_SPINCOUNT"] == env.IDLE_SPINS == "1000"
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    env.let_idle_threads_sleep(busy=True)
    assert os.environ["GOMP_SPINCOUNT"] == "5"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    env.let_idle_threads_sleep(busy=True)
    assert "GOMP_SPINCOUNT" not in os.environ
    loadavg = tmp_path / "loadavg"
    monkeypatch.setattr(cpu_share, "usable_cpus", lambda: 2)
    for line, busy in (("0.52 0.40 0.30 1/100 42", False), ("7.90 8.10 6.00 9/180 42", True)):
        loadavg.write_text(line + "\n")
        assert cpu_share.busy_now(loadavg) is busy
    assert cpu_share.busy_now(tmp_path / "missing") is False


def test_importing_minisgl_decides_the_spin_before_torch_loads(tmp_path):
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    probe = ("import os, sys, core; from core.cpu_share import busy_now; "
             "print(os.environ.get('GOMP_SPINCOUNT') == ('1000' if busy_now() else None), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=clean, timeout=60)
    assert done.stdout.split() == ["True", "False"], done.stdout + done.stderr


def test_the_engine_computes_on_the_threads_asked_for():
    import torch

    from core.llm import LLM

    before = torch.get_num_threads()
    try:
        with LLM("random:tiny-qwen3", threads=1, max_running_req=2) as llm:
            assert llm.engine.plan.threads == 1 == torch.get_num_threads()
            assert "on cpu on 1 thread in" in llm.engine.describe()
    finally:
        torch.set_num_threads(before)
