"""``minisgl verify``: exit 0 only when every prompt matches transformers exactly; near-ties are reported."""

from __future__ import annotations

import pytest

from core.bench.reference import HFReference, Reference, RefStep
from tests.support.cli import json_lines, run, trace_steps, write

KEYS = {"index", "prompt", "status", "position", "engine_token", "reference_token", "engine_rank_in_reference_top5",
        "logprob_gap", "token_ids", "error"}


@pytest.fixture
def prompts(tmp_path):
    return write(tmp_path / "p.jsonl", '{"prompt": "one two", "max_tokens": 4}\n'
                                       '{"prompt": "three", "max_tokens": 3, "ignore_eos": true}\n')


def test_engine_matches_transformers(model_dirs, prompts):
    result = run("verify", prompts, "--model", model_dirs["qwen2"], "--max-running", "2")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("✓ exact") == 2
    assert "2/2 prompts match transformers token for token" in result.stdout


def test_json_results(model_dirs, prompts):
    result = run("verify", prompts, "--model", model_dirs["llama"], "--ref", "hf", "--json")
    assert result.exit_code == 0, result.stderr
    rows = json_lines(result.stdout)
    assert [r["index"] for r in rows] == [0, 1] and all(KEYS <= set(r) for r in rows)
    assert [r["status"] for r in rows] == ["match", "match"] and rows[1]["matching_tokens"] == 3


def _altered_reference(monkeypatch, alter):
    """Make transformers' answer differ at position 1, so the mismatch paths can be seen end to end."""
    greedy = HFReference.greedy

    def patched(self, *args, **kwargs):
        ref = greedy(self, *args, **kwargs)
        steps = list(ref.steps)
        steps[1] = alter(steps[1])
        return Reference(tuple(steps), ref.stopped)

    monkeypatch.setattr(HFReference, "greedy", patched)


def test_a_near_tie_is_reported_and_fails(model_dirs, prompts, monkeypatch):
    def runner_up_wins(step: RefStep) -> RefStep:  # the reference prefers its second choice
        first, second, *rest = step.top
        return RefStep(second[0], (second, first, *rest))

    _altered_reference(monkeypatch, runner_up_wins)
    result = run("verify", prompts, "--model", model_dirs["llama"], "--json")
    assert result.exit_code == 1
    rows = json_lines(result.stdout)
    assert [r["status"] for r in rows] == ["near-tie", "near-tie"]
    assert all(r["position"] == 1 and r["engine_rank_in_reference_top5"] == 1 for r in rows)
    assert rows[0]["engine_token"] == rows[0]["token_ids"][1] != rows[0]["reference_token"]
    table = run("verify", prompts, "--model", model_dirs["llama"])
    assert table.exit_code == 1 and "≈ near-tie at 1" in table.stdout and "0/2 prompts match" in table.stdout
    assert "#2 in the reference's top-5" in table.stdout


def test_a_real_mismatch_fails(model_dirs, prompts, monkeypatch):
    def unrelated(step: RefStep) -> RefStep:  # the reference is sure of a token the engine did not pick
        other = (step.token + 1) % 320
        return RefStep(other, ((other, 0.0),))

    _altered_reference(monkeypatch, unrelated)
    result = run("verify", prompts, "--model", model_dirs["llama"])
    assert result.exit_code == 1
    assert result.stdout.count("✗ differs at 1") == 2 and "not in the reference's top-5" in result.stdout


def test_a_prompt_the_engine_rejects_is_an_error_row(model_dirs, tmp_path):
    path = write(tmp_path / "p.txt", "fits\n" + "y" * 600 + "\n")
    result = run("verify", path, "--model", model_dirs["llama"], "-n", "2", "--json")
    assert result.exit_code == 1
    rows = json_lines(result.stdout)
    assert [r["status"] for r in rows] == ["match", "error"] and "exceeds the context" in rows[1]["error"]


def test_preempted_requests_match_transformers_and_a_large_pool(model_dirs, tmp_path):
    """A pool of 30 pages for three requests of 22 or so: one is preempted and recomputed, and the trace's
    --verify still finds every generation exact; generate gives the large pool's tokens."""
    prompts = write(tmp_path / "p.jsonl", "".join(f'{{"input_ids": {ids}, "max_tokens": 20, "ignore_eos": true}}\n'
                                                  for ids in ([1, 2, 3], [4, 5, 6, 7], [8, 9])))
    small = ("--model", model_dirs["llama"], "--max-running", "3", "--num-pages", "30")
    trace = run("trace", prompts, *small, "--verify", "--trace-out", tmp_path / "t.jsonl")
    assert trace.exit_code == 0, trace.stderr
    assert any(step["preempted"] for step in trace_steps(tmp_path / "t.jsonl"))
    assert trace.stdout.count("exact") == 3
    tokens = [[r["token_ids"] for r in json_lines(run("generate", prompts, *options, "--json").stdout)]
              for options in (small, small[:4])]
    assert tokens[0] == tokens[1]
