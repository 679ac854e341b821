"""``minisgl trace`` keeping a run: --trace-out, --html and --perfetto, and --replay of a saved trace with no
model loaded, which gives the same screen and the same files as the run itself."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import assert_user_error, run, write
from render.trace_format import read_trace


@pytest.fixture(scope="module")
def recorded(model_dirs, tmp_path_factory):
    """One real run, kept every way: its stdout and its trace, HTML and Perfetto files."""
    root = tmp_path_factory.mktemp("recorded")
    prompts = write(root / "p.jsonl", '{"prompt": "alpha", "max_tokens": 3}\n{"prompt": "beta", "max_tokens": 1}\n'
                                      '{"prompt": "gamma gamma", "max_tokens": 2}\n')
    result = run("trace", prompts, "--model", model_dirs["llama"], "--max-running", "2", "--trace-out",
                 root / "t.jsonl", "--html", root / "t.html", "--perfetto", root / "t.json")
    assert result.exit_code == 0, result.stderr
    return root, result


def test_a_run_writes_the_header_its_steps_and_its_results(recorded, model_dirs):
    root, result = recorded
    trace = read_trace(root / "t.jsonl")
    assert trace.header.model == model_dirs["llama"] and trace.header.prompts == ("alpha", "beta", "gamma gamma")
    assert trace.header.options["max_running"] == 2 and trace.header.options["cache"] == "radix"
    assert [e.batch_size for e in trace.events] == [2, 1, 2, 1]  # uid2 waits for a row, then joins
    assert [len(r["token_ids"]) for r in trace.results] == [3, 1, 2]
    assert "saved" in result.stderr and "ui.perfetto.dev" in result.stderr


def test_replay_gives_the_same_screen_and_the_same_files_without_a_model(recorded, tmp_path):
    root, live = recorded
    replayed = run("trace", "--replay", root / "t.jsonl", "--html", tmp_path / "r.html",
                   "--perfetto", tmp_path / "r.json")
    assert replayed.exit_code == 0, replayed.stderr
    assert replayed.stdout == live.stdout  # the step table, the generations and the timeline
    assert "loading" not in replayed.stderr
    assert (tmp_path / "r.html").read_bytes() == (root / "t.html").read_bytes()
    assert (tmp_path / "r.json").read_bytes() == (root / "t.json").read_bytes()


def test_the_perfetto_file_of_a_real_run_adds_up(recorded):
    root, _ = recorded
    trace = read_trace(root / "t.jsonl")
    events = json.loads((root / "t.json").read_text())["traceEvents"]
    work = [e for e in events if e["ph"] == "X" and e["pid"] == 2 and e["name"] != "waiting"]
    for uid in range(3):
        assert sum(e["args"]["uid"] == uid for e in work) == sum(uid in {r.uid for r in s.reqs} for s in trace.events)
    waits = [e for e in events if e["ph"] == "X" and e["name"] == "waiting"]
    assert [(w["args"]["uid"], w["args"]["steps"]) for w in waits] == [(2, 1)]
    steps = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert [round(s["dur"]) for s in steps] == [round(e.elapsed_s * 1e6) for e in trace.events]
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(steps, steps[1:]))


def test_an_interrupted_trace_replays_without_generations(recorded, tmp_path):
    root, _ = recorded
    partial = write(tmp_path / "partial.jsonl", "".join((root / "t.jsonl").read_text().splitlines(True)[:3]))
    result = run("trace", "--replay", partial)
    assert result.exit_code == 0, result.stderr
    assert "scheduled batches" in result.stdout and "generations" not in result.stdout
    assert "interrupted after 2 steps" in result.stderr


@pytest.mark.parametrize("damage, fragment", [
    (lambda lines: lines[:3] + [lines[3][:40]], "line 4: the line is cut short"),
    (lambda lines: [lines[0].replace('"version": 1', '"version": 9')] + lines[1:], "line 1: trace format version 9"),
    (lambda lines: lines[:2] + [lines[2].replace('"phase": "prefill"', '"phase": "decode"', 1)] + lines[3:],
     "line 3: uid 2 decodes before any prefill"),
    (lambda lines: lines[:4] + [lines[4].replace('"batch_size": 1', '"batch_size": 2')] + lines[5:],
     "line 5: batch_size 2 but 1 request"),
])
def test_a_damaged_trace_is_refused_with_the_line(recorded, tmp_path, damage, fragment):
    root, _ = recorded
    lines = (root / "t.jsonl").read_text().split("\n")[:-1]
    damaged = damage(lines)
    path = write(tmp_path / "bad.jsonl", "\n".join(damaged) + ("" if "cut short" in fragment else "\n"))
    assert_user_error(run("trace", "--replay", path, "--html", tmp_path / "x.html"), fragment)
    assert not (tmp_path / "x.html").exists()


def test_replay_mistakes_are_one_line(recorded, tmp_path):
    root, _ = recorded
    assert_user_error(run("trace", "--replay", tmp_path / "nope.jsonl"), "no such file")
    assert_user_error(run("trace", root / "t.jsonl", "--replay", root / "t.jsonl"), "takes no PROMPTS")
    assert_user_error(run("trace", "--replay", root / "t.jsonl", "--html", tmp_path / "no" / "x.html"), "'--html'")


def test_export_paths_are_checked_before_the_model_loads(tmp_path):
    prompts = write(tmp_path / "p.txt", "hello\n")
    assert_user_error(run("trace", prompts, "--model", tmp_path / "missing-model", "--perfetto",
                          tmp_path / "no" / "t.json"), "'--perfetto'")


LESSON = ('{"prompt": "a shared prefix, then one", "max_tokens": 4, "arrival_step": 0}\n'
          '{"prompt": "a shared prefix, then two", "max_tokens": 2, "arrival_step": 0}\n'
          '{"prompt": "something else entirely", "max_tokens": 3, "arrival_step": 2}\n'
          '{"prompt": "a shared prefix, then three", "max_tokens": 2, "arrival_step": 1}\n')


def test_arrivals_waits_and_the_radix_tree_survive_the_round_trip(model_dirs, tmp_path):
    prompts = write(tmp_path / "lesson.jsonl", LESSON)
    live = run("trace", prompts, "--model", model_dirs["llama"], "--max-running", "2", "--show-radix",
               "--trace-out", tmp_path / "t.jsonl", "--html", tmp_path / "t.html", "--perfetto", tmp_path / "t.json")
    assert live.exit_code == 0, live.stderr
    trace = read_trace(tmp_path / "t.jsonl")
    assert any(e.arrived for e in trace.events[1:]) and any(e.waits for e in trace.events)
    assert all(e.kv is not None and e.radix is not None for e in trace.events)
    assert trace.token_text  # the radix spans as the tokenizer reads them, for a replay without one
    assert sorted(r["uid"] for r in trace.results) == [0, 1, 2, 3]
    replayed = run("trace", "--replay", tmp_path / "t.jsonl", "--show-radix", "--html", tmp_path / "r.html")
    assert replayed.exit_code == 0, replayed.stderr
    assert replayed.stdout == live.stdout
    assert (tmp_path / "r.html").read_bytes() == (tmp_path / "t.html").read_bytes()
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    reasons = {w.text for e in trace.events for w in e.waits}
    waited = [e["args"] for e in events if e["ph"] == "X" and e["name"] == "waiting"]
    assert waited and {r for w in waited for r in w.get("reasons", [])} == reasons
    kv = [e["args"] for e in events if e["ph"] == "C" and e["name"] == "KV pages"]
    assert [k["free"] for k in kv] == [e.kv.free for e in trace.events]
