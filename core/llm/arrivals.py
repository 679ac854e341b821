"""Arrivals: requests that enter while the engine runs, at a chosen step or a chosen time.

A step-based arrival is submitted just before that step is scheduled (a before-step callback on the loop's
thread), so the same prompts give the same steps on any machine. A time-based one is submitted at the first
step boundary after its time. If the engine runs out of work before the next arrival, a step-based request
comes in at once (there is no step to wait for) and a time-based one after a sleep until its time.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Sequence

from core.errors import InvalidParamsError


@dataclass(frozen=True)
class Arrival:
    """When one request enters: before step ``step`` of the run, or ``after_s`` seconds after it starts."""

    step: int | None = None
    after_s: float | None = None

    def __post_init__(self) -> None:
        if (self.step is None) == (self.after_s is None):
            raise InvalidParamsError("an arrival is either a step or a time after the start, not both")
        if self.step is not None and (isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0):
            raise InvalidParamsError(f"arrival_step must be an integer >= 0, got {self.step!r}")
        if self.after_s is not None and (isinstance(self.after_s, bool) or not isinstance(self.after_s, (int, float))
                                         or not self.after_s >= 0):
            raise InvalidParamsError(f"arrival_s must be a number of seconds >= 0, got {self.after_s!r}")


def every_n_steps(count: int, every: int) -> list[Arrival]:
    """Request i arrives before step i * every."""
    if every < 1:
        raise InvalidParamsError(f"--arrival-every must be at least 1 step, got {every}")
    return [Arrival(step=i * every) for i in range(count)]


def poisson(count: int, rate_per_s: float, seed: int) -> list[Arrival]:
    """Arrivals of a Poisson process (exponential gaps, ``rate_per_s`` on average), the first at time 0."""
    if not rate_per_s > 0:
        raise InvalidParamsError(f"--arrival-rate must be a positive number of requests per second, got {rate_per_s}")
    rng = random.Random(seed)
    times, now = [], 0.0
    for i in range(count):
        if i:
            now += rng.expovariate(rate_per_s)
        times.append(Arrival(after_s=now))
    return times


class ArrivalFeeder:
    """Hands out the indices of the requests due at a step boundary, in arrival order (ties by index)."""

    def __init__(self, arrivals: Sequence[Arrival | None], first_step: int) -> None:
        self._first_step = first_step
        self._started = time.perf_counter()
        order = sorted(range(len(arrivals)), key=lambda i: self._key(arrivals[i], i))
        self._queue = [(i, arrivals[i]) for i in order]

    @staticmethod
    def _key(arrival: Arrival | None, index: int) -> tuple[int, float, int]:
        if arrival is None:
            return (0, 0.0, index)
        return (1, arrival.step, index) if arrival.step is not None else (2, arrival.after_s, index)

    @property
    def done(self) -> bool:
        return not self._queue

    def due(self, step: int) -> list[int]:
        """Requests whose step has come (``step`` counts from the engine's first step) or whose time has passed."""
        now = time.perf_counter() - self._started
        ready = [i for i, a in self._queue if a is None or (a.step is not None and a.step <= step - self._first_step)
                 or (a.after_s is not None and a.after_s <= now)]
        self._queue = [(i, a) for i, a in self._queue if i not in ready]
        return ready

    def next_when_idle(self) -> list[int]:
        """The engine has nothing to do: the next step-based arrivals now, else wait for the next time-based one."""
        first = min((a.step for _, a in self._queue if a is not None and a.step is not None), default=None)
        if first is None:
            wait = min(a.after_s for _, a in self._queue) - (time.perf_counter() - self._started)
            if wait > 0:
                time.sleep(wait)
            return self.due(step=self._first_step)
        ready = [i for i, a in self._queue if a is not None and a.step == first]
        self._queue = [(i, a) for i, a in self._queue if i not in ready]
        return ready
