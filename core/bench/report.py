"""What a benchmark run produces: plain dataclasses that the CLI renders as a table or prints as JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from core.cpu_share import OtherLoad

if TYPE_CHECKING:  # the floor's module measures with torch; a report is read without it (minisgl --help)
    from core.bench.floor import Floor

# (stage name, units done, units in total): called as each engine or baseline makes progress
ProgressFn = Callable[[str, int, int], None]


def no_progress(stage: str, done: int, total: int) -> None:
    pass


@dataclass(frozen=True)
class RunResult:
    """One engine's run over its requests: the whole workload, or its first ``requests`` for a baseline."""

    name: str
    wall_s: float
    output_tokens: int
    requests: int
    others: OtherLoad | None = None  # what other processes used of our CPUs meanwhile (None: not measured)
    preemptions: int | None = None  # requests the engine preempted during the run (None: not an engine run)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def busy(self) -> bool:
        """Whether other processes kept the machine busy during the run: its figures are not a quiet machine's."""
        return self.others is not None and self.others.busy

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "wall_s": round(self.wall_s, 4), "output_tokens": self.output_tokens,
                "output_tokens_per_s": round(self.output_tokens_per_s, 2), "requests": self.requests,
                "others_cpus": None if self.others is None else round(self.others.cpus, 2), "busy": self.busy,
                "preemptions": self.preemptions}


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1): the smallest value with at least ``q`` of them at or below it.

    Every figure the project reports (``minisgl bench``, the scripts) uses this one rule, so two reports of the
    same timings give the same p50 and p99.
    """
    if not values:
        raise ValueError("no values to take a percentile of")
    ordered = sorted(values)
    rank = math.ceil(q * len(ordered) - 1e-9)  # 1-based; the epsilon keeps 0.29 * 100 at rank 29, not 30
    return ordered[min(len(ordered) - 1, max(0, rank - 1))]


@dataclass(frozen=True)
class Percentiles:
    mean: float
    p50: float
    p99: float

    @classmethod
    def of(cls, values: list[float]) -> "Percentiles":
        if not values:
            return cls(0.0, 0.0, 0.0)
        return cls(sum(values) / len(values), percentile(values, 0.50), percentile(values, 0.99))

    def to_dict(self) -> dict[str, float]:
        return {"mean": round(self.mean, 5), "p50": round(self.p50, 5), "p99": round(self.p99, 5)}


@dataclass(frozen=True)
class Latency:
    """Per-request latency of the engine: time to first token and time per output token after it (seconds)."""

    ttft: Percentiles
    tpot: Percentiles

    def to_dict(self) -> dict[str, Any]:
        return {"ttft_s": self.ttft.to_dict(), "tpot_s": self.tpot.to_dict()}


@dataclass
class BenchReport:
    workload: str
    model: str
    device: str
    requests: int
    prompt_tokens: int
    results: list[RunResult]
    latency: Latency | None
    matmul_gflops: float
    model_gflop: float  # the workload's FLOPs (see flops.workload_flops), in GFLOP
    skipped: dict[str, str] = field(default_factory=dict)  # baseline name -> why it did not run
    batch1_ms_per_token: float | None = None  # median decode time per token of one request running alone
    copy_gbps: float = 0.0  # the device's measured copy bandwidth (read + write)
    read_gbps: float = 0.0  # a read-only pass's bandwidth (a CPU; 0: not measured); the floors use the better
    floor: Floor | None = None  # the ideal engine's time on the measured ceilings (core/bench/floor.py)
    batch1_floor_ms: float | None = None  # one batch-1 decode step's bytes over the bandwidth (Ceilings.stream_gbps)
    precision: str = "exact"  # the engine's; other than 'exact', results also hold 'minisgl exact' of this run
    precision_note: str = ""  # what that precision came to on this machine (core/engine/plan.py)
    exact_batch1_ms_per_token: float | None = None  # the exact engine's batch-1 figure in the same run
    page_size: int = 1  # the engine's KV page, in tokens

    @property
    def floor_fraction(self) -> float:
        """The floor's time over the engine's: 1.0 would be an engine that wastes nothing."""
        engine = self.result("minisgl")
        return self.floor.seconds / engine.wall_s if self.floor and engine and engine.wall_s > 0 else 0.0

    @property
    def batch1_floor_fraction(self) -> float:
        if not self.batch1_floor_ms or not self.batch1_ms_per_token:
            return 0.0
        return self.batch1_floor_ms / self.batch1_ms_per_token

    def result(self, name: str) -> RunResult | None:
        return next((r for r in self.results if r.name == name), None)

    @property
    def engine_gflops(self) -> float:
        engine = self.result("minisgl")
        return self.model_gflop / engine.wall_s if engine and engine.wall_s > 0 else 0.0

    @property
    def model_flops_fraction(self) -> float:
        return self.engine_gflops / self.matmul_gflops if self.matmul_gflops > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload, "model": self.model, "device": self.device, "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "results": [r.to_dict() for r in self.results],
            "latency": self.latency.to_dict() if self.latency else None,
            "matmul_gflops": round(self.matmul_gflops, 2),
            "model_gflop": round(self.model_gflop, 2),
            "engine_gflops": round(self.engine_gflops, 2),
            "model_flops_fraction": round(self.model_flops_fraction, 4),
            "skipped": self.skipped,
            "batch1_ms_per_token": None if self.batch1_ms_per_token is None else round(self.batch1_ms_per_token, 4),
            "copy_gbps": round(self.copy_gbps, 1),
            "read_gbps": round(self.read_gbps, 1),
            "floor": self.floor.to_dict() if self.floor else None,
            "floor_fraction": round(self.floor_fraction, 4),
            "batch1_floor_ms": None if self.batch1_floor_ms is None else round(self.batch1_floor_ms, 4),
            "batch1_floor_fraction": round(self.batch1_floor_fraction, 4),
            "precision": self.precision, "precision_note": self.precision_note,
            "exact_batch1_ms_per_token": (None if self.exact_batch1_ms_per_token is None
                                          else round(self.exact_batch1_ms_per_token, 4)),
            "page_size": self.page_size,
        }
