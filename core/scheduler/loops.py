"""The two loops that run the scheduler's steps, and the stream a launch runs on.

The plain loop finishes each step before it schedules the next; the overlap loop launches step N and only then
handles step N-1's results, so the host's work hides behind the device's. What makes that safe:

* the scheduler's bookkeeping moves on when a batch is launched (``Req.complete_step``), not when its result
  comes back, and sampled tokens go from device to device through the token pool;
* which requests sample this step, and whether a request is finished, are judged from what was scheduled and
  from the tokens the host has received, never from lengths that a later launch already moved on
  (core/scheduler/results.py);
* a request that stopped on EOS at step N-1 was already launched again in step N: its extra token is dropped
  (``Req.done``), and the row and pages it gave back wait for step N to finish (``ReleaseFence``);
* a batch under a grammar samples only once step N-1's tokens have moved its requests' matchers on: its token
  masks are filled on a worker thread then, while the device runs step N's forward pass and the host schedules
  step N+1, and step N samples just before step N+1 is launched, which reads its tokens
  (core/constrain/fill.py says why the two threads never touch the same matcher or buffer);
* on CUDA, metadata is prepared on the scheduler's stream and forward passes run on the engine's stream,
  which waits for the scheduler's before each launch.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Protocol

import torch

from core.scheduler.results import Results
from core.scheduler.step import InFlight, Prepared


class Steps(Protocol):
    """The scheduler's step methods, as the loops call them."""

    @property
    def busy(self) -> bool: ...

    def wait_for_work(self, stop_when_idle: bool) -> bool: ...

    def receive(self) -> bool: ...

    def schedule_next_batch(self) -> Prepared | None: ...

    def launch(self, prepared: Prepared) -> InFlight: ...

    def start_masks(self, flight: InFlight) -> None: ...

    def sample_under_grammar(self, flight: InFlight) -> None: ...

    def take_results(self, flight: InFlight) -> Results: ...

    def hand_out(self, flight: InFlight, results: Results) -> None: ...

    def fail_stuck_requests(self) -> None: ...


def plain_loop(steps: Steps, stop_when_idle: bool) -> None:
    """Each step finishes (launch, wait, handle results) before the next is scheduled."""
    while True:
        if not steps.busy and not steps.wait_for_work(stop_when_idle):
            return
        if not steps.receive():
            return
        if not steps.busy:
            continue
        prepared = steps.schedule_next_batch()
        if prepared is None:
            steps.fail_stuck_requests()
            continue
        flight = steps.launch(prepared)
        steps.sample_under_grammar(flight)
        steps.hand_out(flight, steps.take_results(flight))


def overlap_loop(steps: Steps, stop_when_idle: bool) -> None:
    """Launch step N, then handle step N-1's results while step N runs."""
    last: InFlight | None = None
    while True:
        if last is None and not steps.busy and not steps.wait_for_work(stop_when_idle):
            return
        if not steps.receive():
            if last is not None:
                steps.sample_under_grammar(last)
                steps.hand_out(last, steps.take_results(last))
            return
        prepared = steps.schedule_next_batch() if steps.busy else None
        if last is not None:
            steps.sample_under_grammar(last)  # under a grammar: its masks filled while this step was scheduled
        current = steps.launch(prepared) if prepared is not None else None
        results = steps.take_results(last) if last is not None else None
        if current is not None:
            steps.start_masks(current)  # they follow step N-1's tokens, just taken; filled on a worker thread
        if last is not None:
            steps.hand_out(last, results)  # replies and frees (which wait for ``current``) beside that fill
        elif current is None:
            steps.fail_stuck_requests()  # nothing in flight, nothing held: the head can never fit
        last = current


@contextmanager
def after_current_stream(stream: torch.cuda.Stream | None, device: torch.device) -> Iterator[None]:
    """Run on ``stream`` (the engine's) once it has waited for the current stream: the metadata a launch reads."""
    if stream is None:
        yield
        return
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
