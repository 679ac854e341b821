"""``minisgl bench``'s engine room: workloads, the engine run, the transformers baselines and the ceiling; and
the transformers reference with the near-tie rule that judges every comparison (reference.py).

The runner (torch, transformers, the engine) is imported on first use, so the names and workloads can be
listed without it.
"""

from __future__ import annotations

from typing import Any

from core.bench.names import BASELINES, CUDA_BASELINES
from core.bench.report import BenchReport, Latency, Percentiles, RunResult, percentile
from core.bench.workload import WORKLOADS, Workload, make_workload

_FROM_RUNNER = ("BenchOptions", "run_bench")

__all__ = ["BenchOptions", "BenchReport", "Latency", "Percentiles", "RunResult", "percentile", "BASELINES",
           "CUDA_BASELINES", "WORKLOADS", "Workload", "make_workload", "run_bench"]


def __getattr__(name: str) -> Any:
    if name in _FROM_RUNNER:
        from core.bench import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'core.bench' has no attribute {name!r}")
