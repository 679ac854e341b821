"""Structured output from the command line: ``generate --json-schema FILE`` and ``--regex``, a prompt file's
``json_schema`` and ``regex`` keys, and the trace, which marks the constrained requests (``§``) and keeps how long
their masks took to fill in each step, through ``--trace-out`` and its replay."""

from __future__ import annotations

import json
import re

from tests.support.cli import assert_user_error, json_lines, run, trace_steps, write

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "rank"],
          "properties": {"city": {"type": "string", "maxLength": 6},
                         "rank": {"type": "integer", "minimum": 0, "maximum": 9}}}


def test_generate_constrains_every_output_to_the_schema_or_the_pattern(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "a\nbb\nccc\n")
    schema = write(tmp_path / "s.json", json.dumps(SCHEMA))
    result = run("generate", prompts, "--model", model_dirs["llama"], "--json-schema", schema, "-t", "1",
                 "--seed", "3", "-n", "48", "--json")
    assert result.exit_code == 0, result.stderr
    for row in json_lines(result.stdout):
        value = json.loads(row["text"])
        assert set(value) == {"city", "rank"} and len(value["city"]) <= 6 and value["rank"] <= 9
        assert row["finish_reason"] == "stop"
    result = run("generate", prompts, "--model", model_dirs["llama"], "--regex", "[a-c]{2}-[0-9]", "--json")
    assert all(re.fullmatch("[a-c]{2}-[0-9]", row["text"]) for row in json_lines(result.stdout)), result.stdout


def test_bad_constraints_are_usage_errors(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "a\n")
    assert_user_error(run("generate", prompts, "--model", model_dirs["llama"], "--regex", "[0-9"),
                      "unclosed character class")
    assert_user_error(run("generate", prompts, "--model", model_dirs["llama"], "--json-schema", tmp_path / "none.json"),
                      "none.json")
    assert_user_error(run("generate", prompts, "--model", model_dirs["llama"], "--regex", "a",
                          "--json-schema", tmp_path / "none.json"), "not both")
    bad = write(tmp_path / "b.jsonl", '{"prompt": "a", "json_schema": {"type": "objekt"}}\n')
    assert_user_error(run("generate", bad, "--model", model_dirs["llama"]), "line 1")


def test_the_trace_marks_constrained_requests_and_keeps_their_mask_time(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.jsonl", json.dumps({"prompt": "a", "max_tokens": 40, "json_schema": SCHEMA}) + "\n"
                    + json.dumps({"prompt": "b", "max_tokens": 3}) + "\n"
                    + json.dumps({"prompt": "c", "max_tokens": 5, "regex": "(yes|no)"}) + "\n")
    result = run("trace", prompts, "--model", model_dirs["llama"], "--trace-out", tmp_path / "t.jsonl")
    assert result.exit_code == 0, result.stderr
    assert "uid0§:" in result.stdout and "uid1:" in result.stdout and "uid1§" not in result.stdout
    steps = trace_steps(tmp_path / "t.jsonl")
    # the grammars compile on a worker: uid1 may start before the others, which join once theirs are ready
    marks = {r["uid"]: r["constrained"] for s in steps for r in s["reqs"]}
    assert marks == {0: True, 1: False, 2: True}
    under = [s for s in steps if any(r["constrained"] for r in s["reqs"])]
    assert under and all(s["mask_fill_s"] > 0 for s in under)  # every step with a row under a grammar
    assert all(s["mask_fill_s"] == 0 for s in steps if s not in under)
    replay = run("trace", "--replay", tmp_path / "t.jsonl")
    assert replay.exit_code == 0, replay.stderr
    assert "uid0§:" in replay.stdout
