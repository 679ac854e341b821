"""Each request's life through the steps, and when each step ran: what the timeline views draw.

Read from the step events alone. A request arrives before a step (``arrived``; a trace from before arrivals
were recorded has every request arriving before step 0), waits in the queue until its first batch, then runs;
in steps of the other phase it is paused (running, but not in that batch); it is gone once it finished. A
request listed in a step's ``waits`` is queued in that step whatever came before (a chunked prefill waits
between its chunks); one listed in a step's ``preempted`` gave its pages back in that step and is queued again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.events import StepEvent, WaitReason

NOT_ARRIVED, QUEUED, PREFILL, DECODE, PAUSED, GONE, PREEMPTED = " ", "w", "P", "D", "p", ".", "x"
STATE_NAMES = {NOT_ARRIVED: "not arrived", QUEUED: "waiting", PREFILL: "prefill", DECODE: "decode",
               PAUSED: "paused", GONE: "finished", PREEMPTED: "preempted"}


@dataclass(frozen=True)
class RequestLife:
    uid: int
    arrival_step: int  # the first step it could have joined: it was submitted before this step was formed
    states: str  # one character per step, from the constants above
    waits: dict[int, WaitReason]  # step -> why it was not admitted in that step (when the events say)
    finish_step: int | None = None  # the step it finished in; None if it had not when the trace ends


def arrival_steps(events: Sequence[StepEvent], num_requests: int) -> list[int]:
    """The step before which each request arrived; 0 for requests no event reports arriving."""
    arrival = [0] * num_requests
    for event in reversed(events):  # the first report wins
        for uid in event.arrived:
            if 0 <= uid < num_requests:
                arrival[uid] = event.step
    return arrival


def request_lives(events: Sequence[StepEvent], num_requests: int) -> list[RequestLife]:
    arrival = arrival_steps(events, num_requests)
    states: list[list[str]] = [[] for _ in range(num_requests)]
    waits: list[dict[int, WaitReason]] = [{} for _ in range(num_requests)]
    started = [False] * num_requests
    finish: list[int | None] = [None] * num_requests
    for i, event in enumerate(events):
        in_batch = {r.uid for r in event.reqs}
        waiting = {w.uid: w for w in event.waits}
        preempted = set(event.preempted)
        for uid in range(num_requests):
            if uid in in_batch:
                state = PREFILL if event.phase == "prefill" else DECODE
                started[uid] = True
            elif uid in preempted:
                state = PREEMPTED
            elif finish[uid] is not None:
                state = GONE
            elif i < arrival[uid]:
                state = NOT_ARRIVED
            elif uid in waiting or not started[uid]:
                state = QUEUED
            else:
                state = PAUSED
            if uid in waiting:
                waits[uid][i] = waiting[uid]
            states[uid].append(state)
        for uid in event.finished:
            if 0 <= uid < num_requests and finish[uid] is None:
                finish[uid] = i
    return [RequestLife(uid, arrival[uid], "".join(states[uid]), waits[uid], finish[uid])
            for uid in range(num_requests)]


def step_starts(events: Sequence[StepEvent]) -> list[float]:
    """When each step began, in seconds from the first: the recorded ``started_s`` when the events have it,
    else the steps laid end to end by their wall times (events from before ``started_s`` was filled)."""
    if not events:
        return []
    recorded = any(e.started_s > 0 for e in events)
    if recorded:
        base = events[0].started_s
        return [e.started_s - base for e in events]
    starts, t = [], 0.0
    for event in events:
        starts.append(t)
        t += event.elapsed_s
    return starts


def step_spans(events: Sequence[StepEvent]) -> list[tuple[float, float]]:
    """(start, duration) of each step in seconds; a step never overlaps the next one's start."""
    starts = step_starts(events)
    spans = []
    for i, (start, event) in enumerate(zip(starts, events)):
        duration = max(event.elapsed_s, 0.0)
        if i + 1 < len(starts):
            duration = min(duration, max(starts[i + 1] - start, 0.0))
        spans.append((start, duration))
    return spans
