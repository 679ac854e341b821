"""Every user mistake: one line 'error: ...' on stderr, exit code 2, no traceback, and nothing loaded first."""

from __future__ import annotations

import pytest

from tests.support.cli import assert_user_error, run, write


@pytest.fixture
def good(tmp_path):
    return write(tmp_path / "good.txt", "hello\n")


def test_missing_prompts_file(tmp_path):
    assert_user_error(run("generate", tmp_path / "nope.txt"), "prompts file")
    assert_user_error(run("trace", tmp_path / "nope.txt"), "not found")
    assert_user_error(run("verify", tmp_path / "nope.txt"), "not found")


def test_prompts_argument_is_required_for_generate():
    assert_user_error(run("generate"), "missing argument 'PROMPTS'")


def test_unreadable_prompts(tmp_path):
    assert_user_error(run("generate", tmp_path), "is a directory")
    (tmp_path / "bin.txt").write_bytes(b"ok\n\xff\n")
    assert_user_error(run("generate", tmp_path / "bin.txt"), "not UTF-8")


def test_empty_prompts_file(tmp_path):
    assert_user_error(run("generate", write(tmp_path / "e.txt", "\n\n")), "has no prompts")
    assert_user_error(run("generate", "-", input=""), "standard input has no prompts")


def test_malformed_jsonl_line_is_named(tmp_path):
    path = write(tmp_path / "p.jsonl", '{"prompt": "fine"}\n{"prompt": "broken"\n')
    assert_user_error(run("generate", path), "p.jsonl line 2: not valid JSON")


@pytest.mark.parametrize("args, fragment", [
    (["--max-tokens", "abc"], "'--max-tokens'"),
    (["--max-tokens", "0"], "'--max-tokens'"),
    (["--temperature", "-1"], "'--temperature'"),
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--top-k", "0"], "top_k must be -1 (off) or an integer >= 1"),
    (["--cache", "lru"], "'lru' is not one of 'naive', 'radix'"),
    (["--page-size", "0"], "'--page-size'"),
    (["--max-running", "-3"], "'--max-running'"),
    (["--no-such-option"], "no such option"),
])
def test_bad_option_values(good, args, fragment):
    assert_user_error(run("generate", good, *args), fragment)


def test_missing_model(good, tmp_path):
    # the model is found as loading starts, so stderr (not a terminal here) first says "loading ..."
    assert_user_error(run("generate", good, "--model", tmp_path / "nowhere"), "does not exist", after_load=True)
    assert_user_error(run("trace", good, "--model", write(tmp_path / "model.bin", "x")), "not a .gguf",
                      after_load=True)


def test_model_without_chat_template_with_chat(good, model_dirs):
    assert_user_error(run("generate", good, "--model", model_dirs["llama"], "--chat"), "no chat template",
                      after_load=True)


def test_verify_refuses_sampling(good, tmp_path):
    assert_user_error(run("verify", good, "--temperature", "0.7"), "verify compares greedy decoding")
    sampled = write(tmp_path / "s.jsonl", '{"prompt": "a", "temperature": 0.5}\n')
    assert_user_error(run("trace", sampled, "--verify"), "s.jsonl line 1")
    assert_user_error(run("verify", good, "--ref", "vllm"), "'vllm' is not one of 'hf'")
    assert_user_error(run("verify", good, "--generation-config", "none"), "leave out --generation-config")
    assert_user_error(run("verify", good, "--override-generation-config", '{"temperature": 0.5}'),
                      "takes no sampling defaults: leave out --override-generation-config")


def test_unwritable_outputs_fail_before_loading(good, tmp_path):
    assert_user_error(run("trace", good, "--trace-out", tmp_path / "no" / "t.jsonl"), "'--trace-out'")
    assert_user_error(run("trace", good, "--svg", tmp_path / "no" / "t.svg"), "'--svg'")


def test_no_command_shows_help_and_version_works():
    result = run()
    assert result.exit_code == 0 and "generate" in result.stdout and "verify" in result.stdout
    version = run("--version")
    assert version.exit_code == 0 and version.stdout.startswith("minisgl ")


def test_engine_options_are_checked(good, model_dirs):
    assert_user_error(run("generate", good, "--attention", "magic"), "'magic' is not one of 'torch', 'flashinfer'")
    assert_user_error(run("generate", good, "--model", model_dirs["llama"], "--dtype", "fp8"), "unknown dtype 'fp8'")
    assert_user_error(run("generate", good, "--model", model_dirs["llama"], "--tp", "3"), "cannot be split over 3",
                      after_load=True)  # the model's config says how many heads it has
    assert_user_error(run("generate", good, "--cuda-graph-max-bs", "-1"), "'--cuda-graph-max-bs'")


def test_options_that_would_be_ignored_are_refused(good):
    assert_user_error(run("generate", good, "--logprobs", "2"), "--logprobs needs --json")
    assert_user_error(run("trace", good, "--cache", "naive", "--show-radix"), "the radix tree needs --cache radix")


def test_arrival_rate_help_and_check_agree(good):
    rate_help = next(ln for ln in run("trace", "--help").stdout.splitlines() if "--arrival-rate" in ln)
    assert "R > 0" in rate_help and "x>=0" not in rate_help
    assert_user_error(run("trace", good, "--arrival-rate", "0"), "give R > 0")
    assert_user_error(run("trace", good, "--arrival-rate", "-2"), "'--arrival-rate'")


def test_verify_names_the_sampling_option_not_the_file(good):
    result = run("verify", good, "--temperature", "0.7")
    assert_user_error(result, "--temperature 0.7")
    assert "line" not in result.stderr


def test_max_tokens_beyond_the_context_fails_before_the_load(good, model_dirs, tmp_path):
    # the test checkpoint's config.json says 512 tokens; the embedded GGUF's header says 8192
    assert_user_error(run("generate", good, "--model", model_dirs["llama"], "--max-tokens", "1000000000"),
                      "--max-tokens 1000000000 cannot fit in the model's context of 512 tokens")
    assert_user_error(run("generate", good, "--max-tokens", "8192"), "the model's context of 8,192 tokens")
    assert_user_error(run("verify", good, "--max-tokens", "100", "--max-seq-len", "100"), "--max-seq-len 100")
    in_file = write(tmp_path / "p.jsonl", '{"prompt": "a"}\n{"prompt": "b", "max_tokens": 600}\n')
    assert_user_error(run("trace", in_file, "--model", model_dirs["llama"]), "max_tokens 600 on")
