"""The live step table at 80 columns: one line a step, its header whole, nothing wider than the screen; the
same steps on a wide screen keep the full words."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from core.events import ReqStep, StepEvent, WaitReason
from render.steps import LiveSteps
from render.trace_format import read_trace

REPLAY = Path(__file__).resolve().parents[2] / "docs" / "replay.jsonl"
HEADER = ["step", "phase", "bs", "tok", "uid:len", "new", "KV", "wait", "done", "ms"]


def screen(view: LiveSteps, width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, height=60, color_system=None).print(view)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def steps_of(lines: list[str]) -> list[str]:
    return [line for line in lines if line.split()[1:2] in (["prefill"], ["decode"]) and line.split()[0].isdigit()]


def busy_steps() -> list[StepEvent]:
    """A crowded run: 32 requests a batch, arrivals, finishes, a full pool of thousands of pages, forced decodes."""
    events = []
    for step in range(6):
        reqs = tuple(ReqStep(uid, 1 if step else 300, 40 if step == 0 else 0) for uid in range(32))
        events.append(StepEvent(step, "prefill" if step == 0 else "decode", 32, sum(r.extend_len for r in reqs), reqs,
                                23_301, 23_301, 1.234, note="decode forced after 1 prefill step" if step else "",
                                finished=tuple(range(step * 4, step * 4 + 4)), waiting=120,
                                arrived=tuple(range(100 + step * 10, 110 + step * 10)),
                                waits=(WaitReason(40 + step, "kv_pages", "KV: needs 12 pages, 3 free"),)))
    return events


def test_the_lessons_steps_fit_80_columns_one_line_each():
    trace = read_trace(REPLAY)
    view = LiveSteps(show_cached=True, total_requests=len(trace.header.prompts), show_legend=True)
    for event in trace.events:
        view.add(event)
    narrow = screen(view, 80)
    assert all(len(line) <= 80 for line in narrow)
    header = next(line for line in narrow if line.split()[:2] == ["step", "phase"])
    assert header.split() == HEADER  # whole, in one line
    rows = steps_of(narrow)
    assert [int(row.split()[0]) for row in rows] == [e.step for e in trace.events]  # one line a step
    assert "4:2+3" in rows[8] and "1 row" in rows[2]  # the cached prefix and the reason, compact
    wide = screen(view, 120)
    assert len(steps_of(wide)) >= len(trace.events)
    assert "uid4:2(+3)" in "\n".join(wide) and "1 · no row" in "\n".join(wide)


def test_a_crowded_step_still_takes_one_line_at_80_columns():
    view = LiveSteps(show_cached=True, total_requests=200, show_legend=True)
    for event in busy_steps():
        view.add(event)
    lines = screen(view, 80)
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    header = next(line for line in lines if line.split()[:2] == ["step", "phase"])
    assert header.split() == HEADER + ["note"]
    rows = steps_of(lines)
    assert len(rows) == 6
    assert rows[1].split()[-1] == "forced" and "+" in rows[1] and "120 KV" in rows[1]  # counted, not wrapped
