"""What a user sees from ``generate``, ``trace`` and ``verify``: results exactly as generated wherever stdout
goes, an exit code that says whether every prompt finished, short echoes of long prompts, output paths
checked before the run, and an engine described in words."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.cli import assert_user_error, json_lines, run, write


def run_piped(*args: object, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``minisgl ARGS`` as a real process with stdout and stderr piped, on a narrow screen."""
    return subprocess.run([sys.executable, "-m", "minisgl_cli", *map(str, args)], capture_output=True, text=True,
                          input=stdin, timeout=300, env={**os.environ, "COLUMNS": "40"})


def test_piped_output_carries_each_completion_exactly(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "hello there\n" + "x" * 600 + "\nsecond prompt\n")
    args = ("generate", prompts, "--model", model_dirs["llama"], "-n", "60", "--ignore-eos")
    rows = json_lines(run(*args, "--json").stdout)
    piped = run_piped(*args)
    assert piped.returncode == 1, piped.stderr  # the too-long prompt failed; the others are still printed
    for row in (rows[0], rows[2]):
        assert len(row["text"]) > 40
        assert row["prompt"] + row["text"] + "\n" in piped.stdout  # no newline or space inserted, no tab expanded
    error_line = f"error: {rows[1]['error']}"
    assert len(error_line) > 40 and error_line in piped.stdout.splitlines()  # one line, however narrow the screen
    # while stdout is piped, stderr says what the command is doing
    assert f"loading {model_dirs['llama']}…" in piped.stderr and "generating: 3 requests…" in piped.stderr
    assert "1 of 3 prompts failed" in piped.stderr


@pytest.mark.parametrize("args, stdin", [
    # every prompt over the context (511 alone fits the 512 the model's config gives, so it is no usage error)
    (["--max-tokens", "511"], None),
    (["--num-pages", "1", "--max-running", "1"], None),  # a pool too small for any prompt
    ([], '{"input_ids": [1, 999999]}\n'),  # a token outside the vocabulary
])
def test_a_run_with_failed_prompts_exits_1(model_dirs, tmp_path, args, stdin):
    source = "-" if stdin else write(tmp_path / "p.txt", "hello\n")
    result = run("generate", source, "--model", model_dirs["llama"], "--json", *args, input=stdin)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert all(r["finish_reason"] == "error" for r in json_lines(result.stdout))


def test_trace_and_verify_exit_1_when_a_prompt_failed(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "fits\n" + "y" * 600 + "\n")
    trace = run("trace", prompts, "--model", model_dirs["llama"], "-n", "2")
    assert trace.exit_code == 1 and "exceeds the context" in trace.stdout
    verify = run("verify", prompts, "--model", model_dirs["llama"], "-n", "2")
    assert verify.exit_code == 1


def test_a_long_refused_prompt_is_echoed_cut_with_its_token_count(model_dirs, tmp_path):
    prompt = " ".join(f"word{i}" for i in range(10_000))
    result = run("generate", write(tmp_path / "p.txt", prompt + "\n"), "--model", model_dirs["llama"])
    assert result.exit_code == 1
    assert len(result.stdout.splitlines()) < 20  # not the 10,000 words
    assert "characters not shown" in result.stdout and "word0 word1" in result.stdout and "word9999" in result.stdout
    tokens = json_lines(run("generate", tmp_path / "p.txt", "--model", model_dirs["llama"], "--json").stdout)[0]
    assert f"{tokens['prompt_tokens']:,} prompt tokens" in result.stdout
    assert "exceeds the context of 512 tokens" in result.stdout


def test_output_paths_are_checked_before_the_run(model_dirs, tmp_path):
    assert_user_error(run("trace", "--model", model_dirs["llama"], "--svg", tmp_path), "is a directory")
    assert_user_error(run("trace", "--model", model_dirs["llama"], "--trace-out", tmp_path), "is a directory")


def test_engine_options_are_named_as_typed(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "hello\n")
    result = run("generate", prompts, "--model", model_dirs["llama"], "--num-pages", "1")
    assert_user_error(result, "--num-pages 1 is too small for --max-running 32")
    assert "max_running_req" not in result.stderr


def test_the_engine_is_described_in_one_plain_line_and_in_detail_with_verbose(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "hello\n")
    wide = run("generate", prompts, "--model", model_dirs["llama"], "-n", "1")
    narrow = run("generate", prompts, "--model", model_dirs["llama"], "-n", "1", "--max-running", "2")
    ready = [line for line in wide.stderr.splitlines() if line.startswith("engine")]
    assert ready == ["engine ready on cpu, float32: room for 16,384 tokens in the KV cache (8.0 MiB)"]
    lines = wide.stderr.splitlines()  # the ready line follows the load's own last line
    assert lines[lines.index(ready[0]) - 1].startswith(f"loading {model_dirs['llama']}: done in "), wide.stderr
    assert "room for 1,024 tokens in the KV cache" in narrow.stderr
    for jargon in ("panels", "VNNI", "AVX", "budget", "attention", "CUDA graphs", "MiB;"):
        assert jargon not in wide.stderr
    verbose = run("generate", prompts, "--model", model_dirs["llama"], "-n", "1", "--verbose")
    assert verbose.exit_code == 0, verbose.stderr
    assert "engine ready on cpu, float32: room for 16,384 tokens" in verbose.stderr
    assert "KV cache for 16,384 tokens (8.0 MiB; room for all 32 running requests at the full 512-token " \
           "context" in verbose.stderr and "attention with" in verbose.stderr
    for internal in ("TorchAttentionBackend", "KV pages of", "max_running_req"):
        assert internal not in verbose.stderr


def test_help_shows_flags_as_flags_and_every_baseline():
    for args in (["--help"], ["generate", "--help"], ["trace", "--help"], ["verify", "--help"], ["bench", "--help"],
                 ["serve", "--help"]):
        result = run(*args)
        assert result.exit_code == 0 and "<bool>" not in result.stdout and "list[" not in result.stdout, args
    stop = next(line for line in run("generate", "--help").stdout.splitlines() if "--stop " in line)
    assert stop.split()[1:3] == ["--stop", "TEXT"]
    narrow = subprocess.run([sys.executable, "-m", "minisgl_cli", "bench", "--help"], capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": "80"})
    assert "hf-continuous" in narrow.stdout and "…" not in narrow.stdout


def test_help_fits_80_columns_whole(tmp_path):
    from typer.testing import CliRunner

    from minisgl_cli.app import app

    def help_of(command: str) -> list[str]:
        result = CliRunner(env={"COLUMNS": "80"}).invoke(app, [command, "--help"])
        assert result.exit_code == 0, result.output
        return result.stdout.splitlines()

    generate = help_of("generate")
    assert len(generate) <= 110, len(generate)
    assert any("SmolLM2-135M-Instruct." in line for line in generate)  # the --model default, whole
    for command in ("generate", "trace", "verify", "serve", "bench", "models"):
        lines = help_of(command)
        assert all(len(line) <= 80 for line in lines) and "…" not in "".join(lines), command  # nothing cut
        flags = {"bench": ("--threads",), "models": ()}.get(command, ("--threads", "--tp", "--kv-dtype"))
        assert all(any(f"{flag} " in line for line in lines) for flag in flags), command  # the engine's options


def test_a_piped_stream_is_the_exact_text(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "hello there\nsecond prompt\n")
    args = ("generate", prompts, "--model", model_dirs["llama"], "-n", "30", "--ignore-eos")
    rows = json_lines(run(*args, "--json").stdout)
    streamed = run(*args, "--stream")
    assert streamed.exit_code == 0, streamed.stderr
    for row in rows:
        assert row["prompt"] + row["text"] + "\n" in streamed.stdout
    assert "length · 30 generated" in streamed.stdout
    assert_user_error(run(*args, "--stream", "--json"), "--stream writes text")


def test_counts_of_one_are_singular(model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "hello\n")
    result = run("generate", prompts, "--model", model_dirs["llama"], "-n", "1", "--max-running", "1", "--verbose",
                 "--num-pages", "1")  # too small for the prompt: an error result, exit code 1
    assert "room for 1 token in the KV cache" in result.stderr and "1 of 1 prompt failed" in result.stderr
    assert "generating: 1 request…" in result.stderr and "1/1 request finished, 0 tokens in" in result.stderr
    assert "1 page as asked" in result.stderr
    alone = run("generate", prompts, "--model", model_dirs["llama"], "-n", "1", "--max-running", "1", "--verbose")
    assert "room for the one running request at the full" in alone.stderr
    assert "1/1 request finished, 1 token in" in alone.stderr
    for wrong in ("1 requests", "1 tokens", "1 pages", "all 1 running"):
        assert wrong not in result.stderr + alone.stderr


def test_the_ready_line_follows_the_phase_and_long_lines_wrap_only_on_a_terminal():
    import io

    from rich.console import Console

    from render.activity import Activity

    long = "engine ready on cpu, float32: room for 23,301 tokens in the KV cache (1.0 GiB) " + "x" * 40
    for terminal in (False, True):
        buffer = io.StringIO()
        activity = Activity(Console(file=buffer, width=80, force_terminal=terminal, color_system=None))
        with activity.phase("loading m", closing="engine ready"):
            activity.note("converting m once")
            activity.note(long)
            activity.note("the plan in detail")  # after the ready line: held with it
        activity.line("saved run.json (open it in ui.perfetto.dev or chrome://tracing)" + " y" * 30)
        plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buffer.getvalue()).replace("\r", "\n")
        lines = [line.rstrip() for line in plain.splitlines() if line.strip()]
        if terminal:  # Rich wrapped them at words, so the live display knew each line's rows; no spinner beside
            assert all(len(line) <= 80 for line in lines), lines
            ready = next(i for i, line in enumerate(lines) if line.startswith("engine ready"))
            assert all("loading m" not in line for line in lines[ready:]) and "the plan in detail" in lines[ready:]
        else:  # a log: one line each, the ready line right after the load's end
            assert lines == ["loading m…", "converting m once", "loading m: done in 0.0 s", long,
                             "the plan in detail",
                             "saved run.json (open it in ui.perfetto.dev or chrome://tracing)" + " y" * 30]
