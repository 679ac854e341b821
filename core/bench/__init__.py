"""``minisgl bench``'s engine room: workloads, the engine run, the transformers baselines and the ceiling."""

from core.bench.report import BenchReport, Latency, Percentiles, RunResult
from core.bench.runner import BASELINES, CUDA_BASELINES, BenchOptions, run_bench
from core.bench.workload import WORKLOADS, Workload, make_workload

__all__ = ["BenchOptions", "BenchReport", "Latency", "Percentiles", "RunResult", "BASELINES", "CUDA_BASELINES",
           "WORKLOADS", "Workload", "make_workload", "run_bench"]
