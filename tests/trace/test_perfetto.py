"""The Perfetto export: valid trace-event JSON whose request slices add up to the steps and whose counters
are the step events' numbers."""

from __future__ import annotations

import json
from collections import Counter

from render.perfetto import ENGINE_PID, REQUESTS_PID, perfetto_trace, save_perfetto
from tests.support.trace_samples import LABELS, sample_trace

PHASES = {"M", "X", "C", "i"}


def check_trace_event_json(document: dict) -> list[dict]:
    """The parts of the trace-event format that Perfetto and chrome://tracing rely on."""
    events = document["traceEvents"]
    assert document["displayTimeUnit"] in ("ms", "ns")
    for event in events:
        assert event["ph"] in PHASES, event
        assert isinstance(event["pid"], int) and isinstance(event["name"], str)
        if event["ph"] != "M":
            assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0, event
        if event["ph"] == "X":
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0 and "tid" in event
        if event["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in event["args"].values())
        if event["ph"] == "i":
            assert event["s"] in ("t", "p", "g")
    return events


def slices(events: list[dict], pid: int, tid: int | None = None) -> list[dict]:
    return [e for e in events if e["ph"] == "X" and e["pid"] == pid and (tid is None or e["tid"] == tid)]


def test_valid_trace_event_json_with_a_track_per_request(tmp_path):
    path = tmp_path / "t.json"
    save_perfetto(sample_trace(), path)
    events = check_trace_event_json(json.loads(path.read_text()))
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
             and e["pid"] == REQUESTS_PID}
    assert names == {uid + 1: f"uid{uid} {label}" for uid, label in enumerate(LABELS)}


def test_request_slices_add_up_to_the_steps():
    trace = sample_trace()
    events = perfetto_trace(trace)["traceEvents"]
    per_request = Counter(e["args"]["uid"] for e in slices(events, REQUESTS_PID) if e["name"] != "waiting")
    expected = Counter(r.uid for step in trace.events for r in step.reqs)
    assert per_request == expected
    assert sum(per_request.values()) == sum(step.batch_size for step in trace.events)
    engine = slices(events, ENGINE_PID)
    assert [s["args"]["step"] for s in engine] == list(range(len(trace.events)))
    assert [(s["args"]["phase"], s["args"]["batch_size"], s["args"]["tokens"]) for s in engine] == [
        (e.phase, e.batch_size, e.num_tokens) for e in trace.events]
    for uid in range(len(LABELS)):  # a request's slices never overlap, and follow the steps' real times
        track = sorted(slices(events, REQUESTS_PID, uid + 1), key=lambda s: s["ts"])
        for a, b in zip(track, track[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (a, b)
    first = engine[0]
    assert first["ts"] == 0 and abs(engine[3]["ts"] - (0.139 - 0.100) * 1e6) < 1e-3
    assert abs(first["dur"] - trace.events[0].elapsed_s * 1e6) < 1e-3


def test_slices_carry_uid_extend_cached_and_the_wait_reason():
    events = perfetto_trace(sample_trace())["traceEvents"]
    uid2 = slices(events, REQUESTS_PID, 3)
    assert [s["name"] for s in uid2] == ["waiting", "prefill", "decode", "decode"]
    assert uid2[1]["args"] == {"uid": 2, "step": 3, "extend_len": 2, "cached_len": 4, "batch_size": 1}
    assert uid2[0]["args"]["reason"] == "no free table row (--max-running 2)" and uid2[0]["args"]["steps"] == 2
    uid3_wait = slices(events, REQUESTS_PID, 4)[0]
    assert uid3_wait["args"]["reasons"] == ["behind uid2, which did not fit",
                                            "KV: needs 40 pages, 12 free, 0 evictable"]
    instants = [(e["name"], e["args"]["uid"]) for e in events if e["ph"] == "i"]
    assert instants.count(("arrived", 3)) == 1 and instants.count(("finished", 3)) == 1


def test_counters_match_the_step_events():
    trace = sample_trace()
    events = perfetto_trace(trace)["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    kv = [c["args"] for c in counters if c["name"] == "KV pages"]
    assert kv == [{"requests": sum(p for _, p in e.kv.by_request), "cached": e.kv.cached, "free": e.kv.free}
                  for e in trace.events]
    assert [c["args"]["batch size"] for c in counters if c["name"] == "batch size"] == [
        e.batch_size for e in trace.events]
    assert [c["args"]["waiting"] for c in counters if c["name"] == "queue length"] == [e.waiting for e in trace.events]
    assert all(sum(part.values()) == 64 for part in kv)
