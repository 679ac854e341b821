"""A preemption as every view shows it, from hand-built step events: uid1 gives its pages back at step 2, waits as
'preempted' and is prefilled again at step 4 (the timeline, the live detail, the replay's lives, Perfetto, the
trace file)."""

from __future__ import annotations

from rich.console import Console

from core.events import KVUsage, ReqStep, StepEvent, WaitReason
from render.html_replay import page_data
from render.lifecycle import PREEMPTED, request_lives
from render.perfetto import REQUESTS_PID, perfetto_trace
from render.step_detail import step_detail
from render.timeline import request_states
from render.trace_format import Trace, TraceHeader, parse_trace, trace_lines

WAIT = WaitReason(1, "preempted", "preempted when the KV pool ran out; its 2 tokens are kept")


def event(step: int, phase: str, reqs: list[tuple[int, int, int]], **extra) -> StepEvent:
    steps = tuple(ReqStep(*r) for r in reqs)
    kv = KVUsage(((0, 4 + step),), 0, 16 - 4 - step, 16)
    return StepEvent(step=step, phase=phase, batch_size=len(steps), num_tokens=sum(r.extend_len for r in steps),
                     reqs=steps, kv_pages_used=16 - kv.free, kv_pages_total=16, elapsed_s=0.01, kv=kv,
                     started_s=0.1 + 0.01 * step, **extra)


def preemption_trace() -> Trace:
    events = [event(0, "prefill", [(0, 4, 0), (1, 4, 0)], arrived=(0, 1)),
              event(1, "decode", [(0, 1, 4), (1, 1, 4)]),
              event(2, "decode", [(0, 1, 5)], preempted=(1,), preempted_pages=5, waits=(WAIT,), waiting=1),
              event(3, "decode", [(0, 1, 6)], waits=(WAIT,), waiting=1, finished=(0,)),
              event(4, "prefill", [(1, 6, 0)]),
              event(5, "decode", [(1, 1, 6)], finished=(1,))]
    results = [{"uid": i, "text": "x", "token_ids": [1, 2, 3], "finish_reason": "length", "error": None,
                "prompt_tokens": 4} for i in range(2)]
    return Trace(TraceHeader("random:tiny", {}, ("a", "b")), events, results)


def test_every_view_marks_the_step_a_request_was_preempted_in():
    trace = preemption_trace()
    assert request_states(trace.events, [0, 1])[1] == "PDx·PD"
    assert request_lives(trace.events, 2)[1].states[2] == PREEMPTED
    assert [life["states"] for life in page_data(trace)["lives"]][1][2] == PREEMPTED
    console = Console(width=200, record=True)
    console.print(step_detail(trace.events[2]))
    assert "preempted uid1: 5 pages given back" in console.export_text()
    instants = [e for e in perfetto_trace(trace)["traceEvents"]
                if e["ph"] == "i" and e["pid"] == REQUESTS_PID and e["name"] == "preempted"]
    assert [(e["tid"], e["args"]["step"], e["args"]["pages_freed_in_step"]) for e in instants] == [(2, 2, 5)]


def test_the_trace_file_keeps_a_preemption():
    trace = preemption_trace()
    again = parse_trace(trace_lines(trace))
    assert again.events[2].preempted == (1,) and again.events[2].preempted_pages == 5
    assert again.events[3].waits[0].kind == "preempted"
