"""``minisgl generate``: continuations with finish reason and counts, a summary, JSON lines, stdin, errors."""

from __future__ import annotations

import shutil

import pytest

from core import LLM, SamplingParams
from tests.support.cli import json_lines, run, write


def summary_value(stdout: str, label: str) -> str:
    line = next(ln for ln in stdout.splitlines() if ln.strip().startswith(label))
    return line.split()[-1]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("prompts") / "p.txt", "hello there\n\nsecond prompt\n")


def test_prints_each_prompt_with_its_continuation_and_a_summary(model_dirs, prompts_file):
    result = run("generate", prompts_file, "--model", model_dirs["llama"], "--max-tokens", "3")
    assert result.exit_code == 0, result.stderr
    assert "hello there" in result.stdout and "second prompt" in result.stdout
    assert result.stdout.count("length · ") == 2 and "3 generated" in result.stdout
    assert summary_value(result.stdout, "requests") == "2"
    assert summary_value(result.stdout, "prompt tokens") == "24"
    assert summary_value(result.stdout, "generated tokens") == "6"
    assert "tok/s" in result.stdout


def test_json_lines_match_the_offline_api(model_dirs, prompts_file):
    result = run("generate", prompts_file, "--model", model_dirs["llama"], "-n", "4", "--json")
    assert result.exit_code == 0, result.stderr
    rows = json_lines(result.stdout)
    assert [r["index"] for r in rows] == [0, 1]
    assert all(set(r) >= {"index", "prompt", "text", "token_ids", "finish_reason", "error"} for r in rows)
    expected = LLM(model_dirs["llama"]).generate(["hello there", "second prompt"], SamplingParams(max_tokens=4))
    assert [r["token_ids"] for r in rows] == [e["token_ids"] for e in expected]
    assert [r["text"] for r in rows] == [e["text"] for e in expected]
    assert [r["prompt"] for r in rows] == ["hello there", "second prompt"]
    assert all(r["finish_reason"] == "length" and r["error"] is None for r in rows)


def test_stdin_jsonl_with_per_prompt_settings_and_token_ids(model_dirs):
    stdin = '{"prompt": "ab", "max_tokens": 2}\n{"input_ids": [5, 6, 7], "max_tokens": 3, "ignore_eos": true}\n'
    result = run("generate", "-", "--model", model_dirs["qwen2"], "--json", input=stdin)
    assert result.exit_code == 0, result.stderr
    first, second = json_lines(result.stdout)
    assert len(first["token_ids"]) == 2 and second["prompt"] == [5, 6, 7] and len(second["token_ids"]) == 3
    assert second["prompt_tokens"] == 3


def test_command_line_max_tokens_overrides_the_file(model_dirs, tmp_path):
    path = write(tmp_path / "p.jsonl", '{"prompt": "ab", "max_tokens": 2}\n')
    rows = json_lines(run("generate", path, "--model", model_dirs["llama"], "-n", "5", "--json").stdout)
    assert len(rows[0]["token_ids"]) == 5


def test_a_prompt_too_long_for_the_context_is_its_own_error(model_dirs, tmp_path):
    path = write(tmp_path / "p.txt", "short one\n" + "x" * 600 + "\nanother\n")
    result = run("generate", path, "--model", model_dirs["llama"], "-n", "2", "--json")
    assert result.exit_code == 1, result.stderr  # the results are printed, and the exit code says one failed
    assert "1 of 3 prompts failed" in result.stderr
    rows = json_lines(result.stdout)
    assert [r["finish_reason"] for r in rows] == ["length", "error", "length"]
    assert "exceeds the context of 512 tokens" in rows[1]["error"] and rows[1]["token_ids"] == []
    table = run("generate", path, "--model", model_dirs["llama"], "-n", "2")
    assert table.exit_code == 1 and "exceeds the context" in table.stdout
    assert summary_value(table.stdout, "errors") == "1"


def test_a_single_failed_prompt_is_said_in_the_singular(model_dirs, tmp_path):
    result = run("generate", write(tmp_path / "p.txt", "x" * 600 + "\n"), "--model", model_dirs["llama"], "-n", "2")
    assert result.exit_code == 1
    assert "1 of 1 prompt failed; its error is in the result (exit code 1)" in result.stderr
    two = run("generate", write(tmp_path / "q.txt", "x" * 600 + "\nfine\n"), "--model", model_dirs["llama"], "-n", "2")
    assert "1 of 2 prompts failed; its error is in the results" in two.stderr


def test_sampling_with_a_seed_is_reproducible(model_dirs, prompts_file):
    args = ("generate", prompts_file, "--model", model_dirs["llama"], "-n", "6", "--temperature", "1.0",
            "--top-k", "50", "--top-p", "0.9", "--seed", "3", "--json")
    assert json_lines(run(*args).stdout) == json_lines(run(*args).stdout)


def test_chat_applies_the_chat_template(model_dirs, tmp_path):
    from transformers import AutoTokenizer

    model = tmp_path / "chat-model"
    shutil.copytree(model_dirs["llama"], model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
                               "{% if add_generation_prompt %}:{% endif %}")
    tokenizer.save_pretrained(model)
    rows = json_lines(run("generate", write(tmp_path / "p.txt", "hi\n"), "--model", model, "--chat", "-n", "1",
                          "--json").stdout)
    assert rows[0]["prompt"] == "hi" and rows[0]["prompt_tokens"] == len("<hi>:")


def test_the_logits_controls_match_the_offline_api(model_dirs, tmp_path):
    """The penalties, logit bias, min-p, min_tokens and stop token ids, typed as options or set per prompt in a
    JSONL file, run as SamplingParams with the same values do."""
    path = write(tmp_path / "p.jsonl", '{"prompt": "ab"}\n{"prompt": "cd", "logit_bias": {"65": 100}, '
                                       '"stop_token_ids": [65], "min_tokens": 2}\n')
    result = run("generate", path, "--model", model_dirs["llama"], "-n", "6", "--json", "--repetition-penalty",
                 "1.5", "--frequency-penalty", "1", "--presence-penalty", "-0.5", "--logit-bias", "70=3",
                 "--min-p", "0.1", "--stop-token-id", "66")
    assert result.exit_code == 0, result.stderr
    common = dict(max_tokens=6, repetition_penalty=1.5, frequency_penalty=1.0, presence_penalty=-0.5, min_p=0.1)
    expected = LLM(model_dirs["llama"]).generate(["ab", "cd"], [
        SamplingParams(**common, logit_bias={70: 3}, stop_token_ids=[66]),
        SamplingParams(**common, logit_bias={70: 3}, stop_token_ids=[66], min_tokens=2)])
    rows = json_lines(result.stdout)
    assert rows[0]["token_ids"] == expected[0]["token_ids"]
    # the command line's --logit-bias and --stop-token-id replace the file's; min_tokens stays the file's
    assert rows[1]["token_ids"] == expected[1]["token_ids"]


@pytest.mark.parametrize("args, fragment", [
    (["--presence-penalty", "3"], "presence_penalty must be a number in [-2, 2]"),
    (["--repetition-penalty", "0"], "repetition_penalty must be a number > 0"),
    (["--logit-bias", "65"], "is not ID=BIAS"),
    (["--logit-bias", "65=x"], "is not a number"),
    (["--logit-bias", "65=101"], "logit_bias values must be numbers in [-100, 100]"),
    (["--min-tokens", "20"], "min_tokens must be an integer from 0 to max_tokens (16)"),
])
def test_bad_logits_controls_are_usage_errors(args, fragment, prompts_file):
    from tests.support.cli import assert_user_error

    assert_user_error(run("generate", prompts_file, *args), fragment)


def test_the_model_defaults_apply_under_the_files_and_the_options_values(model_dirs, tmp_path):
    path = write(tmp_path / "p.jsonl", '{"prompt": "ab"}\n{"prompt": "cd", "max_tokens": 2}\n')
    result = run("generate", path, "--model", model_dirs["llama"], "--json", "--ignore-eos",
                 "--override-generation-config", '{"max_new_tokens": 5}')
    assert result.exit_code == 0, result.stderr
    assert [len(r["token_ids"]) for r in json_lines(result.stdout)] == [5, 2]


def test_a_bad_override_is_a_usage_error_before_the_load(prompts_file):
    from tests.support.cli import assert_user_error

    assert_user_error(run("generate", prompts_file, "--override-generation-config", '{"temp": 1}'),
                      "--override-generation-config: unknown field 'temp'")
