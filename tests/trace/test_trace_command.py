"""``minisgl trace``: a row per scheduled batch, the generations, the timeline, the trace file and the SVG."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from minisgl_cli.app import app
from minisgl_cli.trace_file import TraceFile
from tests.support.cli import run, trace_steps, write


@pytest.fixture
def prompts(tmp_path):
    return write(tmp_path / "p.jsonl", '{"prompt": "alpha", "max_tokens": 3}\n{"prompt": "beta", "max_tokens": 1}\n'
                                       '{"prompt": "gamma gamma", "max_tokens": 2}\n')


def step_rows(stdout: str) -> list[list[str]]:
    """The data rows of the step table: lines that start with a step number and a phase."""
    rows = []
    for line in stdout.split("request timeline")[0].splitlines():
        cells = line.split()
        if len(cells) > 2 and cells[0].isdigit() and cells[1] in ("prefill", "decode"):
            rows.append(cells)
    return rows


def test_trace_shows_every_batch_the_generations_and_the_timeline(model_dirs, prompts, tmp_path):
    out = tmp_path / "trace.jsonl"
    result = run("trace", prompts, "--model", model_dirs["llama"], "--trace-out", out)
    assert result.exit_code == 0, result.stderr
    events = trace_steps(out)
    assert [e["step"] for e in events] == list(range(len(events)))
    assert [e["phase"] for e in events] == ["prefill", "decode", "decode"]
    assert [e["batch_size"] for e in events] == [3, 2, 1]
    assert [[r["uid"] for r in e["reqs"]] for e in events] == [[0, 1, 2], [0, 2], [0]]
    assert events[0]["reqs"][2]["extend_len"] == len("gamma gamma")
    rows = step_rows(result.stdout)
    assert [(r[0], r[1], r[2]) for r in rows] == [("0", "prefill", "3"), ("1", "decode", "2"), ("2", "decode", "1")]
    assert "uid0:5 uid1:4 uid2:11" in result.stdout
    assert "generations" in result.stdout and "alpha" in result.stdout and "gamma gamma" in result.stdout
    timeline = result.stdout.split("request timeline")[1]
    assert "PDD" in timeline and "P " in timeline and "PD" in timeline
    assert "wrote 3 step events" in result.stderr


def test_requests_that_do_not_fit_wait_and_the_timeline_shows_it(model_dirs, prompts, tmp_path):
    out = tmp_path / "trace.jsonl"
    result = run("trace", prompts, "--model", model_dirs["llama"], "--max-running", "1", "--trace-out", out)
    assert result.exit_code == 0, result.stderr
    events = trace_steps(out)
    assert all(e["batch_size"] == 1 for e in events) and len(events) == 3 + 1 + 2
    assert events[0]["waiting"] == 2
    timeline = result.stdout.split("request timeline")[1]
    assert "PDD" in timeline and "···P" in timeline and "····PD" in timeline


def test_prefix_cache_hits_are_shown(model_dirs, tmp_path):
    path = write(tmp_path / "p.txt", "a shared prefix, then one\na shared prefix, then two\n")
    result = run("trace", path, "--model", model_dirs["llama"], "--cache", "radix", "--max-running", "1",
                 "-n", "2")
    assert result.exit_code == 0, result.stderr
    assert "(+cached)" in result.stdout
    assert "uid1:" in result.stdout and "(+2" in result.stdout  # the second prompt reuses the shared prefix


def test_svg_export_and_verify_marks(model_dirs, prompts, tmp_path):
    svg = tmp_path / "trace.svg"
    result = run("trace", prompts, "--model", model_dirs["qwen3"], "--svg", svg, "--verify")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("✓ exact") == 3
    assert "3/3 prompts match transformers" in result.stdout
    text = svg.read_text()
    assert text.startswith("<svg") and "scheduled" in text and "timeline" in text


def test_ctrl_c_leaves_a_valid_partial_trace(model_dirs, prompts, tmp_path, monkeypatch):
    write_step = TraceFile.write

    def interrupted_at_third_step(self, event):
        if self.lines == 2:
            raise KeyboardInterrupt
        write_step(self, event)

    monkeypatch.setattr(TraceFile, "write", interrupted_at_third_step)
    out = tmp_path / "trace.jsonl"
    result = run("trace", prompts, "--model", model_dirs["llama"], "--trace-out", out)
    assert result.exit_code == 130
    assert [e["step"] for e in trace_steps(out)] == [0, 1]
    assert out.read_text().endswith("\n")
    assert "interrupted after 2 steps" in result.stdout
    assert "2 complete step events are in" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.slow
def test_default_trace_is_the_chapters_five_prompts_on_the_embedded_model(smollm2_dir, tmp_path):
    out = tmp_path / "trace.jsonl"
    result = run("trace", "--trace-out", out)
    assert result.exit_code == 0, result.stderr
    events = trace_steps(out)
    assert [e["phase"] for e in events] == ["prefill"] + ["decode"] * 5
    assert [e["batch_size"] for e in events] == [5, 4, 3, 3, 2, 1]
    assert [len(r) for r in [step_rows(result.stdout)]] == [6]
    for prompt in ("The capital of France is", "List three prime numbers:", "def fibonacci(n):", "1 + 1 =",
                   "Once upon a time,"):
        assert prompt in result.stdout
    assert "Paris" in result.stdout


def test_trace_with_two_ranks_shows_rank_zeros_batches(model_dirs, prompts, tmp_path):
    """A real process, as a user runs it: the workers are spawned and stopped by the command itself."""
    import os
    import subprocess
    import sys

    out = tmp_path / "trace.jsonl"
    done = subprocess.run([sys.executable, "-m", "minisgl_cli", "trace", str(prompts), "--model", model_dirs["qwen3"],
                           "--tp", "2", "--trace-out", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    events = trace_steps(out)
    assert {e["tp_size"] for e in events} == {2}
    assert [e["batch_size"] for e in events] == [3, 2, 1]


def test_a_burst_prefilled_past_the_streak_says_so(model_dirs, tmp_path):
    # "ab" decodes from step 1 while three 8-token prompts (a burst: more than a chunk of 4 not yet started) wait
    lines = ['{"prompt": "ab", "max_tokens": 8}'] + ['{"prompt": "cdefghij", "max_tokens": 1}'] * 3
    prompts = write(tmp_path / "p.jsonl", "\n".join(lines) + "\n")
    out = tmp_path / "trace.jsonl"
    result = run("trace", prompts, "--model", model_dirs["llama"], "--max-extend-tokens", "4",
                 "--max-prefill-streak", "1", "--trace-out", out)
    assert result.exit_code == 0, result.stderr
    notes = [(e["step"], e["phase"], e.get("note", "")) for e in trace_steps(out)]
    kept = [n for n in notes if n[2].startswith("prefill kept on")]
    assert kept and all(phase == "prefill" for _, phase, _ in kept)
    assert kept[0] == (2, "prefill", "prefill kept on after 1 prefill step: a burst of new prompts waits")
    assert "a burst of new prompts waits" in result.stdout  # the table's note column, in words
    narrow = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["trace", str(prompts), "--model", model_dirs["llama"],
                                                          "--max-extend-tokens", "4", "--max-prefill-streak", "1"])
    assert narrow.exit_code == 0 and [r[-1] for r in step_rows(narrow.stdout) if r[0] == "2"] == ["burst"]
