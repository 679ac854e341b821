"""``minisgl trace`` as a lesson: requests that arrive while it runs, why they wait, the KV pool, the radix tree,
the legend, and the pace options outside a terminal."""

from __future__ import annotations

import pytest

from tests.support.cli import run, trace_steps, write

STAGGERED = ('{"input_ids": [1, 2, 3], "max_tokens": 6, "arrival_step": 0}\n'
             '{"input_ids": [4, 5, 6], "max_tokens": 3, "arrival_step": 0}\n'
             '{"input_ids": [7, 8], "max_tokens": 4, "arrival_step": 2}\n'
             '{"input_ids": [9, 10, 11, 12], "max_tokens": 2, "arrival_step": 3}\n')


def trace_events(tmp_path, *args: object, name: str = "t.jsonl"):
    out = tmp_path / name
    result = run("trace", *args, "--trace-out", out)
    assert result.exit_code == 0, result.stderr
    return result, trace_steps(out)


def without_times(events):
    return [{k: v for k, v in e.items() if k not in ("elapsed_s", "started_s")} for e in events]


def test_step_arrivals_are_deterministic_and_join_a_running_batch(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.jsonl", STAGGERED)
    args = (prompts, "--model", model_dirs["llama"], "--max-running", "2")
    result, first = trace_events(tmp_path, *args, name="a.jsonl")
    _, second = trace_events(tmp_path, *args, name="b.jsonl")
    assert without_times(first) == without_times(second)  # the same file gives the same steps, anywhere
    arrived = {uid: e["step"] for e in first for uid in e["arrived"]}
    assert arrived == {0: 0, 1: 0, 2: 2, 3: 3}
    # uid2 arrives while both rows are busy: it waits for a row, says so, and is prefilled when one frees
    assert {w["uid"]: w["kind"] for w in first[2]["waits"]} == {2: "rows"}
    joined = next(e for e in first if e["phase"] == "prefill" and [r["uid"] for r in e["reqs"]] == [2])
    assert joined["step"] > 2
    assert "new" in result.stdout and "arrived" in result.stdout and "▸" in result.stdout
    assert "no free table row" in trace_steps(tmp_path / "a.jsonl")[2]["waits"][0]["text"]


def test_arrival_every_n_steps_for_a_text_file(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "one\ntwo\nthree\n")
    _, events = trace_events(tmp_path, prompts, "--model", model_dirs["llama"], "-n", "6", "--arrival-every", "2")
    assert {uid: e["step"] for e in events for uid in e["arrived"]} == {0: 0, 1: 2, 2: 4}
    assert [r["uid"] for r in events[2]["reqs"]] == [1]  # prefill first: the newcomer's prompt goes in at once


def test_poisson_arrivals_are_seeded(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "one\ntwo\nthree\nfour\n")
    result, events = trace_events(tmp_path, prompts, "--model", model_dirs["llama"], "-n", "3",
                                  "--arrival-rate", "50", "--seed", "3")
    assert sorted(uid for e in events for uid in e["arrived"]) == [0, 1, 2, 3]
    assert events[0]["arrived"][0] == 0  # the first request comes at time 0
    assert result.stdout.count("length") == 4


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "a", "arrival_step": -1}', "arrival_step must be an integer >= 0"),
    ('{"prompt": "a", "arrival_step": 1, "arrival_s": 0.5}', "not both"),
    ('{"prompt": "a", "arrival_s": "soon"}', "arrival_s must be a number"),
])
def test_bad_arrivals_name_the_line(model_dirs, tmp_path, line, message):
    prompts = write(tmp_path / "p.jsonl", '{"prompt": "ok"}\n' + line + "\n")
    result = run("trace", prompts, "--model", model_dirs["llama"])
    assert result.exit_code == 2
    assert "line 2" in result.stderr and message in result.stderr


def test_both_arrival_options_are_refused(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "one\n")
    result = run("trace", prompts, "--arrival-every", "2", "--arrival-rate", "1")
    assert result.exit_code == 2 and "one of --arrival-every and --arrival-rate" in result.stderr


def test_kv_pool_radix_tree_and_legend_on_a_shared_prefix_run(model_dirs, tmp_path):
    shared = list(range(1, 41))
    prompts = write(tmp_path / "p.jsonl", f'{{"input_ids": {shared + [50]}, "max_tokens": 2}}\n'
                                          f'{{"input_ids": {shared + [60]}, "max_tokens": 2}}\n')
    result, events = trace_events(tmp_path, prompts, "--model", model_dirs["llama"], "--cache", "radix",
                                  "--max-running", "1", "--show-radix")
    assert events[0]["waits"][0]["kind"] == "rows"
    assert "1 · no row" in result.stdout.split("waiting")[0]  # the table's wait column: one waits, for a row
    assert "nobody: every request has been admitted" in result.stdout  # the queue under it, after the last step
    assert "KV pages [" in result.stdout and "cached" in result.stdout
    # after the run both requests hang off their shared 40-token prefix (page 1: each keeps its last prompt
    # token and its first generated one as nodes of their own), and nobody holds a lock any more
    assert "radix cache · 5 nodes · 44 pages" in result.stdout
    assert "40 tok · 40 pages · unlocked, evictable" in result.stdout
    assert all(n["lock_count"] == 0 for n in events[-1]["radix"])
    b_prefill = events[2]  # uid1 reuses the 40 cached tokens: that node is locked by it alone
    assert b_prefill["reqs"][0]["cached_len"] == 40
    shared_node = next(n for n in b_prefill["radix"] if n["num_tokens"] == 40)
    assert (shared_node["lock_count"], shared_node["holders"]) == (1, [1])
    assert "uid:extend_len" in result.stdout and "the forward pass's number" in result.stdout  # the legend
    quiet = run("trace", prompts, "--model", model_dirs["llama"], "--no-legend")
    assert quiet.exit_code == 0 and "the forward pass's number" not in quiet.stdout


def test_pace_options_without_a_terminal_are_ignored_with_a_note(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "one\n")
    result = run("trace", prompts, "--model", model_dirs["llama"], "-n", "2", "--step")
    assert result.exit_code == 0
    assert "--step needs a terminal; running at full speed" in result.stderr


@pytest.mark.slow
def test_the_lesson_on_the_embedded_model_shows_every_completion(smollm2_dir, tmp_path):
    result = run("trace", "sample_prompts/lesson.jsonl", "--max-running", "2")
    assert result.exit_code == 0, result.stderr
    generations = result.stdout.split("generations")[1].split("request timeline")[0]
    row = next(line for line in generations.splitlines() if "1 + 1 =" in line)
    assert "␣" in row  # its one token is a space: shown, not a blank cell
    assert "(+3)" in result.stdout  # "The capital of" reused from the prefix cache


def test_generations_name_each_prompt_by_the_uid_it_got(model_dirs, tmp_path):
    # the file's first prompt arrives last, so it gets uid1; the table must say so, as the timeline does
    prompts = write(tmp_path / "p.jsonl", '{"prompt": "late comer", "max_tokens": 2, "arrival_step": 2}\n'
                                          '{"prompt": "early bird", "max_tokens": 4, "arrival_step": 0}\n')
    result, _ = trace_events(tmp_path, prompts, "--model", model_dirs["llama"])
    generations = result.stdout.split("generations")[1].split("request timeline")[0]
    rows = {line.split()[1]: line.split()[0] for line in generations.splitlines()
            if "late comer" in line or "early bird" in line}
    assert rows == {"late": "1", "early": "0"}
