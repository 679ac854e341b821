"""``serve --log-stats SECONDS``: while the server works, a line on stderr every few seconds with its throughput,
its batch and its KV cache, so whoever runs it sees it work without a metrics scraper.

The figures are the ones /metrics gives (metrics.py, the engine's numbers from its last step), the rates
taken over the interval since the last line. An idle server writes one line after its last request and then
nothing until the next one arrives.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Totals:
    """The server's running totals at one moment."""

    at: float = field(compare=False)  # time.monotonic(); two totals are equal when their counts are
    finished: int
    prompt_tokens: int
    generated_tokens: int


def totals_of(metrics: Any, at: float) -> Totals:
    with metrics.lock:
        return Totals(at, sum(metrics.requests.values()), metrics.prompt_tokens, metrics.generated_tokens)


def stats_line(last: Totals, now: Totals, gauges: dict[str, tuple[float, str]]) -> str:
    def rate(count: int) -> float:
        return count / max(now.at - last.at, 1e-9)

    value = {name: figure for name, (figure, _) in gauges.items()}
    total_pages = max(value["kv_pages_total"], 1)
    return (f"minisgl: prompt {rate(now.prompt_tokens - last.prompt_tokens):,.0f} tok/s, generation "
            f"{rate(now.generated_tokens - last.generated_tokens):,.0f} tok/s, "
            f"{rate(now.finished - last.finished):.1f} requests/s answered; "
            f"running {value['requests_running']:.0f}, waiting {value['requests_waiting']:.0f}, "
            f"preempted {value['preemptions_total']:.0f} so far; "
            f"KV cache {100 * value['kv_pages_used'] / total_pages:.0f}% used "
            f"({100 * value['kv_pages_cached'] / total_pages:.0f}% prefix cache), "
            f"prefix hits {100 * value['prefix_cache_hit_rate']:.0f}%")


class StatsLog:
    """Every ``every_s`` seconds, on a thread of its own, a line for ``write`` unless the server stayed idle."""

    def __init__(self, bridge: Any, write: Callable[[str], None], every_s: float) -> None:
        self.bridge = bridge
        self.write = write
        self.every_s = every_s
        self._stop = threading.Event()
        self.last = totals_of(bridge.totals(), time.monotonic())
        self._idle = True  # the line after the last request has been written

    def tick(self, at: float) -> str | None:
        """The line for the interval that ends ``at``, or None when nothing happened in it and nothing is open."""
        now = totals_of(self.bridge.totals(), at)
        gauges = self.bridge.gauges()
        busy = now != self.last or gauges["requests_in_flight"][0] > 0
        line = stats_line(self.last, now, gauges) if busy or not self._idle else None
        self._idle = not busy
        self.last = now
        return line

    def start(self) -> None:
        threading.Thread(target=self._run, name="minisgl-stats", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            line = self.tick(time.monotonic())
            if line is not None:
                self.write(line)
