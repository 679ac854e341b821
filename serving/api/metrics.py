"""The server's counters and latency histograms, and the Prometheus text format they are scraped in.

Written by hand rather than with a client library: a handful of counters, gauges and three histograms, and the
text format is a few lines (name{labels} value). Replies update it on the engine's loop thread and scrapes
read it on the HTTP side, so one lock guards it.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from dataclasses import dataclass, field

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
REQUEST_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
PREFIX = "minisgl_"
RECENT_SAMPLES = 512  # the newest latencies a dashboard's percentiles are read from


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        at = bisect.bisect_left(self.buckets, value)
        if at < len(self.counts):
            self.counts[at] += 1
        self.total += value
        self.count += 1

    def add(self, other: dict) -> None:
        """Another process's histogram (``snapshot()``'s form) counted into this one."""
        self.counts = [a + b for a, b in zip(self.counts, other["counts"])]
        self.total += other["total"]
        self.count += other["count"]

    def snapshot(self) -> dict:
        return {"counts": list(self.counts), "total": self.total, "count": self.count}

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.total}", f"{name}_count {self.count}"]
        return out


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}  # finished requests by finish_reason
        self.rejected: dict[int, int] = {}  # HTTP errors answered, by status
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.inter_token = Histogram(TOKEN_BUCKETS_S)
        self.request_latency = Histogram(REQUEST_BUCKETS_S)
        self.recent_ttft: deque[float] = deque(maxlen=RECENT_SAMPLES)  # seconds, newest requests
        self.recent_tpot: deque[float] = deque(maxlen=RECENT_SAMPLES)  # seconds per token after the first

    def snapshot(self) -> dict:
        """The counts and histograms as plain data, for another API process to add to its own (share.py)."""
        with self.lock:
            return {"requests": dict(self.requests), "rejected": {str(k): v for k, v in self.rejected.items()},
                    "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
                    "ttft": self.ttft.snapshot(), "inter_token": self.inter_token.snapshot(),
                    "request_latency": self.request_latency.snapshot()}

    def plus(self, snapshots: list[dict]) -> Metrics:
        """A new Metrics: these counts with the snapshots' added (the recent samples stay this process's)."""
        total = Metrics()
        for part in [self.snapshot(), *snapshots]:
            for reason, n in part["requests"].items():
                total.requests[reason] = total.requests.get(reason, 0) + n
            for status, n in part["rejected"].items():
                total.rejected[int(status)] = total.rejected.get(int(status), 0) + n
            total.prompt_tokens += part["prompt_tokens"]
            total.generated_tokens += part["generated_tokens"]
            for name in ("ttft", "inter_token", "request_latency"):
                getattr(total, name).add(part[name])
        total.recent_ttft, total.recent_tpot = self.recent_ttft, self.recent_tpot
        return total

    def rejected_with(self, status: int) -> None:
        with self.lock:
            self.rejected[status] = self.rejected.get(status, 0) + 1

    def render(self, gauges: dict[str, tuple[float, str]]) -> str:
        """The Prometheus text exposition: ``gauges`` (and the engine's counters) are read from the engine at scrape
        time."""
        out: list[str] = []

        def metric(name: str, kind: str, help_text: str, lines: list[str]) -> None:
            out.extend([f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}"])
            out.extend(PREFIX + line for line in lines)

        for name, (value, help_text) in gauges.items():  # the engine's counters end in _total
            metric(name, "counter" if name.endswith("_total") else "gauge", help_text, [f"{name} {value}"])
        with self.lock:
            reasons = {reason: self.requests.get(reason, 0) for reason in ("stop", "length", "abort", "error")}
            reasons.update(self.requests)
            metric("requests_finished_total", "counter", "Requests answered, by finish reason.",
                   [f'requests_finished_total{{finish_reason="{r}"}} {n}' for r, n in sorted(reasons.items())])
            metric("http_errors_total", "counter", "Requests refused with an HTTP error, by status.",
                   [f'http_errors_total{{status="{s}"}} {n}' for s, n in sorted(self.rejected.items())])
            metric("prompt_tokens_total", "counter", "Prompt tokens of every request taken in.",
                   [f"prompt_tokens_total {self.prompt_tokens}"])
            metric("generation_tokens_total", "counter", "Tokens generated.",
                   [f"generation_tokens_total {self.generated_tokens}"])
            metric("time_to_first_token_seconds", "histogram", "From the request's arrival to its first token.",
                   self.ttft.lines("time_to_first_token_seconds"))
            metric("inter_token_latency_seconds", "histogram", "Between consecutive tokens of a request.",
                   self.inter_token.lines("inter_token_latency_seconds"))
            metric("request_latency_seconds", "histogram", "From the request's arrival to its last reply.",
                   self.request_latency.lines("request_latency_seconds"))
        return "\n".join(out) + "\n"
