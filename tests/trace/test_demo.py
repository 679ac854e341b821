"""The demo (scripts/demo.sh) shows memory pressure: run its exact commands, less the step delay, and check that
requests wait for a row and for KV pages, that the pool fills, and that the second lesson preempts a request early
(that a preempted request's tokens are those it would have made alone: tests/scheduling/test_preemption.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import trace_steps

ROOT = Path(__file__).resolve().parents[2]


def demo_arguments(lesson: int = 0) -> list[str]:
    """The arguments scripts/demo.sh gives ``minisgl`` for its ``lesson``-th run, without ``--step-delay``."""
    lines = [ln for ln in (ROOT / "scripts" / "demo.sh").read_text().splitlines() if "bin/minisgl" in ln]
    words = shlex.split(lines[lesson].split("bin/minisgl", 1)[1].replace('"$@"', ""))
    at = words.index("--step-delay")
    return words[:at] + words[at + 2:]


@pytest.mark.slow
def test_the_demo_waits_for_rows_and_for_kv_pages(smollm2_dir, tmp_path):
    out = tmp_path / "demo.jsonl"
    wide = {**os.environ, "COLUMNS": "200"}  # the table's full words, as on a wide terminal
    done = subprocess.run([sys.executable, "-m", "minisgl_cli", *demo_arguments(), "--trace-out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, env=wide)
    assert done.returncode == 0, done.stderr
    events = trace_steps(out)
    first_reasons = [e["waits"][0]["kind"] for e in events if e["waits"]]
    assert "rows" in first_reasons[:3] and "kv_pages" in first_reasons[:6]  # within a few steps
    assert {"rows", "kv_pages", "fcfs"} <= {w["kind"] for e in events for w in e["waits"]}
    assert max(e["kv_pages_used"] for e in events) == events[0]["kv_pages_total"]  # the pool fills up
    assert "1 · no row" in done.stdout and "· no KV" in done.stdout  # the wait column says it in words


@pytest.mark.slow
def test_the_second_lesson_preempts_the_newest_request_within_its_first_steps(smollm2_dir, tmp_path):
    out = tmp_path / "preemption.jsonl"
    done = subprocess.run([sys.executable, "-m", "minisgl_cli", *demo_arguments(1), "--trace-out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    events = trace_steps(out)
    preempted = [(e["step"], uid) for e in events for uid in e["preempted"]]
    assert len(preempted) == 1 and preempted[0][0] <= 8  # one preemption, early
    (step, uid), = preempted
    assert uid == max(r["uid"] for r in events[0]["reqs"])  # the newest request gives way
    assert {w["kind"] for w in events[step]["waits"]} == {"preempted"}
