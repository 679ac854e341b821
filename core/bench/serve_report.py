"""What ``minisgl bench --serve`` measures: each request's timings as the client saw them, each rate's figures,
and the run's report.

The definitions are ``vllm bench serve``'s, so the two tools' figures read the same way: throughput is output
tokens over the wall time of the timed run (first send to last answer), TTFT runs from a request's send to its
first streamed chunk, TPOT is a request's time after that chunk over its tokens after the first, and ITL is
every gap between consecutive chunks of a request (a chunk may carry several tokens: ITL is what a reader of
the stream waits, TPOT what the engine spends per token). Percentiles follow core/bench/report.py's one rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from core.bench.report import Percentiles, RunResult


@dataclass(frozen=True)
class RequestTiming:
    """One request as its client saw it; times in seconds from its send."""

    ok: bool
    output_tokens: int  # the server's usage count (every token, whichever chunk carried it)
    ttft: float  # to the first chunk
    e2e: float  # to the end of the stream
    chunk_gaps: tuple[float, ...]  # between consecutive chunks after the first
    error: str = ""

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first; None for a request of one token."""
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


def rate_name(rate: float) -> str:
    """A rate as it is typed and printed: requests per second, or 'inf' for every request at once."""
    return "inf" if math.isinf(rate) else f"{rate:g}"


@dataclass(frozen=True)
class RateResult:
    """One rate's run over the whole workload."""

    rate: float  # requests per second; math.inf: every request sent at once
    wall_s: float
    timings: list[RequestTiming]

    @property
    def completed(self) -> int:
        return sum(t.ok for t in self.timings)

    @property
    def failed(self) -> int:
        return len(self.timings) - self.completed

    @property
    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.timings if t.ok)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def ttft(self) -> Percentiles:
        return Percentiles.of([t.ttft for t in self.timings if t.ok])

    @property
    def tpot(self) -> Percentiles:
        return Percentiles.of([t.tpot for t in self.timings if t.ok and t.tpot is not None])

    @property
    def itl(self) -> Percentiles:
        return Percentiles.of([gap for t in self.timings if t.ok for gap in t.chunk_gaps])

    @property
    def e2e(self) -> Percentiles:
        return Percentiles.of([t.e2e for t in self.timings if t.ok])

    @property
    def first_error(self) -> str:
        return next((t.error for t in self.timings if not t.ok), "")

    def to_dict(self) -> dict[str, Any]:
        return {"rate": rate_name(self.rate), "completed": self.completed, "failed": self.failed,
                "wall_s": round(self.wall_s, 4), "output_tokens": self.output_tokens,
                "output_tokens_per_s": round(self.output_tokens_per_s, 2), "ttft_s": self.ttft.to_dict(),
                "tpot_s": self.tpot.to_dict(), "itl_s": self.itl.to_dict(), "e2e_s": self.e2e.to_dict(),
                "first_error": self.first_error or None}


@dataclass
class ServeReport:
    """The run: the workload, the offline figure (None: skipped) and every rate measured so far, in order."""

    workload: str
    model: str
    url: str
    requests: int
    prompt_tokens: int
    output_tokens: int  # what each rate's run must generate: the sum of max_tokens
    offline: RunResult | None = None
    rates: list[RateResult] = field(default_factory=list)
    interrupted: bool = False  # stopped with Ctrl-C: the rates are those measured before it

    def of_offline(self, result: RateResult) -> float | None:
        """A rate's throughput over the offline one, the ceiling the same engine reaches with no server."""
        if self.offline is None or not self.offline.output_tokens_per_s:
            return None
        return result.output_tokens_per_s / self.offline.output_tokens_per_s

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "model": self.model, "url": self.url, "requests": self.requests,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "offline": self.offline.to_dict() if self.offline else None,
                "rates": [{**r.to_dict(), "of_offline": _round(self.of_offline(r))} for r in self.rates],
                "interrupted": self.interrupted}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
