"""The dashboard's live figures: what /metrics has, as a viewer reads it at a glance.

Tokens per second is the generated-token counter's rise since the previous reading (readings closer together
than a second reuse the previous rate, so several viewers do not make it jumpy); the latency percentiles are read
from the newest requests' samples rather than the histograms, whose buckets are too coarse to tell p50 from p99.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from serving.api.bridge import EngineBridge

MIN_INTERVAL_S = 1.0


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class LiveFigures:
    def __init__(self, bridge: EngineBridge) -> None:
        self.bridge = bridge
        self._lock = threading.Lock()
        self._at = time.perf_counter()
        self._tokens = 0
        self._rate = 0.0

    def __call__(self) -> dict[str, Any]:
        metrics = self.bridge.metrics
        with metrics.lock:
            tokens = metrics.generated_tokens
            ttft, tpot = list(metrics.recent_ttft), list(metrics.recent_tpot)
            finished = sum(metrics.requests.values())
        now = time.perf_counter()
        with self._lock:
            if now - self._at >= MIN_INTERVAL_S:
                self._rate = (tokens - self._tokens) / (now - self._at)
                self._at, self._tokens = now, tokens
            rate = self._rate
        gauges = self.bridge.gauges()

        def ms(values: list[float], q: float) -> float | None:
            value = percentile(values, q)
            return None if value is None else round(value * 1000, 2)

        return {"tokens_per_s": round(rate, 1), "ttft_p50_ms": ms(ttft, 0.5), "ttft_p90_ms": ms(ttft, 0.9),
                "ttft_p99_ms": ms(ttft, 0.99), "tpot_p50_ms": ms(tpot, 0.5), "tpot_p90_ms": ms(tpot, 0.9),
                "tpot_p99_ms": ms(tpot, 0.99), "running": gauges["requests_running"][0],
                "waiting": gauges["requests_waiting"][0], "finished": finished, "generated_tokens": tokens}
