"""The stats line's figures and when it is written, from the server's own counters (no process, no clock)."""

from __future__ import annotations

from serving.api.metrics import Metrics
from serving.api.stats_log import StatsLog


class Bridge:
    """The two things a StatsLog reads: the counters (one API process's) and the gauges."""

    def __init__(self) -> None:
        self.metrics = Metrics()
        self.figures = {"requests_running": 0, "requests_waiting": 0, "requests_in_flight": 0,
                        "kv_pages_used": 0, "kv_pages_cached": 0, "kv_pages_total": 200, "prefix_cache_hit_rate": 0.0,
                        "preemptions_total": 0}

    def totals(self) -> Metrics:
        return self.metrics

    def gauges(self) -> dict[str, tuple[float, str]]:
        return {name: (value, "") for name, value in self.figures.items()}


def test_a_line_while_busy_one_after_and_none_while_idle():
    bridge = Bridge()
    log = StatsLog(bridge, write=print, every_s=2.0)
    start = log.last.at
    assert log.tick(start + 2) is None  # nothing has happened yet

    bridge.metrics.prompt_tokens += 300
    bridge.metrics.generated_tokens += 2400
    bridge.metrics.requests["length"] = 3
    bridge.figures.update(requests_running=5, requests_waiting=2, requests_in_flight=7, kv_pages_used=50,
                          kv_pages_cached=20, prefix_cache_hit_rate=0.25, preemptions_total=3)
    line = log.tick(start + 4)
    assert line == ("minisgl: prompt 150 tok/s, generation 1,200 tok/s, 1.5 requests/s answered; running 5, "
                    "waiting 2, preempted 3 so far; KV cache 25% used (10% prefix cache), prefix hits 25%")

    bridge.figures.update(requests_running=1, requests_waiting=0, requests_in_flight=1)
    assert "generation 0 tok/s" in log.tick(start + 6)  # a request still open, though it made no token

    bridge.figures.update(requests_running=0, requests_in_flight=0)
    last = log.tick(start + 8)
    assert last is not None and "running 0, waiting 0," in last  # the line after the last request
    assert log.tick(start + 10) is None and log.tick(start + 12) is None

    bridge.metrics.generated_tokens += 10
    assert "generation 5 tok/s" in log.tick(start + 14)  # busy again
