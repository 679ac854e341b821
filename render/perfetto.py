"""A trace as Chrome trace-event JSON, the format Perfetto (ui.perfetto.dev) and chrome://tracing open.

Two processes in the timeline: "engine" holds a track of steps (one slice per scheduled batch) and the counter
tracks (KV pages used by requests / cached / free, batch size, queue length); "requests" holds one track per
request with its waiting time, each prefill chunk and each decode step as slices, and instants where it
arrived, was preempted and finished. Times are the steps' real start and wall times, in microseconds from the
first step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.events import StepEvent
from render.lifecycle import DECODE, PREEMPTED, PREFILL, QUEUED, RequestLife, request_lives, step_spans
from render.trace_format import Trace

ENGINE_PID, REQUESTS_PID = 1, 2
STEPS_TID = 1


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def kv_parts(event: StepEvent) -> dict[str, int]:
    """The KV pool split into requests' own pages, prefix-cache pages and free pages."""
    if event.kv is not None:
        return {"requests": sum(p for _, p in event.kv.by_request), "cached": event.kv.cached,
                "free": event.kv.free}
    return {"requests": event.kv_pages_used - event.kv_pages_cached, "cached": event.kv_pages_cached,
            "free": event.kv_pages_total - event.kv_pages_used}


def _metadata(labels: tuple[str, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": ENGINE_PID, "args": {"name": "engine"}},
        {"ph": "M", "name": "process_sort_index", "pid": ENGINE_PID, "args": {"sort_index": 0}},
        {"ph": "M", "name": "process_name", "pid": REQUESTS_PID, "args": {"name": "requests"}},
        {"ph": "M", "name": "process_sort_index", "pid": REQUESTS_PID, "args": {"sort_index": 1}},
        {"ph": "M", "name": "thread_name", "pid": ENGINE_PID, "tid": STEPS_TID, "args": {"name": "steps"}},
    ]
    for uid, label in enumerate(labels):
        short = " ".join(label.split())[:40]
        out.append({"ph": "M", "name": "thread_name", "pid": REQUESTS_PID, "tid": uid + 1,
                    "args": {"name": f"uid{uid} {short}"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": REQUESTS_PID, "tid": uid + 1,
                    "args": {"sort_index": uid}})
    return out


def _engine_events(events: list[StepEvent], spans: list[tuple[float, float]]) -> list[dict[str, Any]]:
    out = []
    for event, (start, duration) in zip(events, spans):
        args: dict[str, Any] = {"step": event.step, "phase": event.phase, "batch_size": event.batch_size,
                                "tokens": event.num_tokens, "step_ms": round(event.elapsed_s * 1000, 3),
                                "uids": [r.uid for r in event.reqs], "waiting": event.waiting}
        if event.note:
            args["note"] = event.note
        if event.finished:
            args["finished"] = list(event.finished)
        if event.evicted_pages:
            args["evicted_pages"] = event.evicted_pages
        out.append({"ph": "X", "name": f"{event.phase} bs={event.batch_size}", "cat": "step", "pid": ENGINE_PID,
                    "tid": STEPS_TID, "ts": _us(start), "dur": _us(duration), "args": args})
        ts = _us(start)
        out.append({"ph": "C", "name": "KV pages", "pid": ENGINE_PID, "ts": ts, "args": kv_parts(event)})
        out.append({"ph": "C", "name": "batch size", "pid": ENGINE_PID, "ts": ts,
                    "args": {"batch size": event.batch_size}})
        out.append({"ph": "C", "name": "queue length", "pid": ENGINE_PID, "ts": ts, "args": {"waiting": event.waiting}})
    return out


def _request_events(life: RequestLife, events: list[StepEvent], spans: list[tuple[float, float]],
                    result: dict[str, Any] | None) -> list[dict[str, Any]]:
    tid = life.uid + 1
    end_of_run = spans[-1][0] + spans[-1][1]
    out: list[dict[str, Any]] = [{"ph": "i", "s": "t", "name": "arrived", "pid": REQUESTS_PID, "tid": tid,
                                  "ts": _us(spans[min(life.arrival_step, len(spans) - 1)][0]),
                                  "args": {"uid": life.uid, "before_step": life.arrival_step}}]
    chunk = 0
    i = 0
    while i < len(events):
        state = life.states[i]
        if state == QUEUED:  # one slice for a run of waiting steps, with the reasons it was given
            first = i
            while i < len(events) and life.states[i] == QUEUED:
                i += 1
            end = spans[i][0] if i < len(spans) else end_of_run
            reasons = [life.waits[s].text for s in range(first, i) if s in life.waits]
            args: dict[str, Any] = {"uid": life.uid, "steps": i - first, "from_step": first}
            if reasons:
                args["reason"] = reasons[-1]
                args["reasons"] = list(dict.fromkeys(reasons))
            out.append({"ph": "X", "name": "waiting", "cat": "queue", "pid": REQUESTS_PID, "tid": tid,
                        "ts": _us(spans[first][0]), "dur": _us(max(end - spans[first][0], 0.0)), "args": args})
            continue
        if state == PREEMPTED:  # its pages given back before this step; it is queued again from the next one
            out.append({"ph": "i", "s": "t", "name": "preempted", "pid": REQUESTS_PID, "tid": tid,
                        "ts": _us(spans[i][0]), "args": {"uid": life.uid, "step": events[i].step,
                                                         "pages_freed_in_step": events[i].preempted_pages}})
        if state in (PREFILL, DECODE):
            event = events[i]
            req = next(r for r in event.reqs if r.uid == life.uid)
            if state == PREFILL:
                chunk += 1
                name = "prefill" if chunk == 1 else f"prefill chunk {chunk}"
            else:
                name = "decode"
            out.append({"ph": "X", "name": name, "cat": event.phase, "pid": REQUESTS_PID, "tid": tid,
                        "ts": _us(spans[i][0]), "dur": _us(spans[i][1]),
                        "args": {"uid": life.uid, "step": event.step, "extend_len": req.extend_len,
                                 "cached_len": req.cached_len, "batch_size": event.batch_size}})
        i += 1
    finish = life.finish_step
    if finish is not None:
        args = {"uid": life.uid, "step": finish}
        if result is not None:
            args.update(finish_reason=result["finish_reason"], tokens=len(result["token_ids"]))
        out.append({"ph": "i", "s": "t", "name": "finished", "pid": REQUESTS_PID, "tid": tid,
                    "ts": _us(sum(spans[finish])), "args": args})
    return out


def perfetto_trace(trace: Trace) -> dict[str, Any]:
    """The trace-event JSON object for a trace (``traceEvents`` plus the run's settings as ``otherData``)."""
    labels = trace.labels_by_uid
    events = trace.events
    out = _metadata(labels)
    if events:
        spans = step_spans(events)
        by_uid = {r["uid"]: r for r in trace.results or []}
        out += _engine_events(events, spans)
        for life in request_lives(events, len(labels)):
            result = by_uid.get(life.uid)
            out += _request_events(life, events, spans, result)
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"model": trace.header.model, **{k: str(v) for k, v in trace.header.options.items()},
                          "finished": trace.finished}}


def save_perfetto(trace: Trace, path: Path | str) -> None:
    Path(path).write_text(json.dumps(perfetto_trace(trace), ensure_ascii=False), encoding="utf-8")
