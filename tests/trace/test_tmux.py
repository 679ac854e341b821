"""The live trace in a real terminal: run ``minisgl trace`` inside tmux and read the screen back.

Skipped where tmux is not installed. Each test uses its own tmux server (a private socket), so nothing else
running tmux on the machine is touched. Waiting is by polling the screen for a marker, with a generous limit
that only guards against a hang; nothing here measures speed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import write

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

REPO = Path(__file__).resolve().parents[2]
HANG_LIMIT_S = 300


class Tmux:
    def __init__(self, name: str) -> None:
        self.base = ["tmux", "-L", f"minisgl-test-{os.getpid()}-{name}"]

    def __call__(self, *args: str) -> str:
        return subprocess.run(self.base + list(args), check=True, capture_output=True, text=True).stdout

    def start(self, command: str) -> None:
        # the shell stays after the command so that its exit code and the final screen can be read
        self("new-session", "-d", "-s", "t", "-x", "120", "-y", "40", "-c", str(REPO),
             f"{command}; echo EXIT=$?; sleep 600")

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "t", "-S", "-200")

    def wait_for(self, marker: str) -> str:
        """The first screen that shows ``marker``."""
        return self.wait_for_match(re.escape(marker))[1]

    def wait_for_match(self, pattern: str) -> tuple[re.Match, str]:
        """The first match of ``pattern`` on the screen, and the screen it was on."""
        deadline = time.monotonic() + HANG_LIMIT_S
        while time.monotonic() < deadline:
            screen = self.screen()
            found = re.search(pattern, screen)
            if found:
                return found, screen
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} never appeared; the screen was:\n{self.screen()}")

    def cursor_visible(self) -> bool:
        return self("display-message", "-p", "-t", "t", "#{cursor_flag}").strip() == "1"

    def close(self) -> None:
        subprocess.run(self.base + ["kill-server"], capture_output=True)


@pytest.fixture
def tmux(request):
    server = Tmux(request.node.name[:20])
    yield server
    server.close()


def trace_command(*args: object) -> str:
    return shlex.join([sys.executable, "-m", "minisgl_cli", "trace", *map(str, args)])


def paced(command: str) -> str:
    """The command with single-request decode steps on torch: the C step runs a test model's request to its end
    before the screen can show it running."""
    return "MINISGL_DISABLE_CPU_DECODE=1 " + command


def test_live_trace_in_a_terminal(tmux, model_dirs, tmp_path):
    prompts = write(tmp_path / "p.jsonl", '{"prompt": "alpha", "max_tokens": 4}\n{"prompt": "beta", "max_tokens": 2}\n')
    tmux.start(trace_command(prompts, "--model", model_dirs["llama"]))
    screen = tmux.wait_for("EXIT=")
    assert "EXIT=0" in screen
    for part in ("scheduled batches", "prefill", "decode", "generations", "request timeline", "PDDD", "PD"):
        assert part in screen, part
    assert re.search(r"\b(uid)?0:5 (uid)?1:4\b", screen), screen  # the batch's cells, wide or compact
    assert "running…" not in screen  # the live view was replaced by the final tables, not left behind
    assert tmux.cursor_visible()


def test_ctrl_c_in_a_terminal_leaves_it_clean_and_the_trace_valid(tmux, model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "one\ntwo\nthree\n")
    out = tmp_path / "trace.jsonl"
    tmux.start(paced(trace_command(prompts, "--model", model_dirs["llama"], "--max-running", "1", "-n", "480",
                                   "--trace-out", out)))
    live = tmux.wait_for(" decode ")  # the live table grows on screen while the engine works
    assert "scheduled batches" in live and "running…" in live
    tmux("send-keys", "-t", "t", "C-c")
    screen = tmux.wait_for("EXIT=")
    assert "EXIT=130" in screen and "interrupted" in screen and "Traceback" not in screen
    assert tmux.cursor_visible()
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])["type"] == "header" and json.loads(lines[-1])["type"] == "step"  # no results
    steps = [json.loads(line)["step"] for line in lines[1:]]
    assert steps == list(range(len(steps))) and steps


LESSON = ('{"input_ids": [1, 2, 3], "max_tokens": 5, "arrival_step": 0}\n'
          '{"input_ids": [4, 5, 6], "max_tokens": 5, "arrival_step": 0}\n'
          '{"input_ids": [7, 8], "max_tokens": 3, "arrival_step": 1}\n')


def rows_on_screen(screen: str) -> list[str]:
    """The step table's data rows: a step number then a phase."""
    return [line for line in screen.splitlines()
            if len(line.split()) > 2 and line.split()[0].isdigit() and line.split()[1] in ("prefill", "decode")]


def test_step_by_key_waits_for_enter_and_q_stops_cleanly(tmux, model_dirs, tmp_path):
    prompts = write(tmp_path / "p.jsonl", LESSON)
    tmux.start(trace_command(prompts, "--model", model_dirs["llama"], "--max-running", "2", "--step"))
    tmux.wait_for_match(r"Enter or space: next\s+step")  # the caption wraps at a narrow table's width
    time.sleep(1.0)
    assert rows_on_screen(tmux.screen()) == []  # nothing runs until a key is pressed
    for expected in (1, 2, 3):
        tmux("send-keys", "-t", "t", "Enter" if expected != 2 else "Space")
        deadline = time.monotonic() + HANG_LIMIT_S
        while len(rows_on_screen(tmux.screen())) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        screen = tmux.screen()
        assert len(rows_on_screen(screen)) == expected, screen  # exactly one step per key
    assert "waiting" in screen and "no free table row" in screen  # uid2 arrived at step 1; both rows are busy
    assert "KV pages [" in screen and "the forward pass's number" in screen
    tmux("send-keys", "-t", "t", "q")
    screen = tmux.wait_for("EXIT=")
    assert "EXIT=0" in screen and "stopped with q after 3 steps" in screen and "Traceback" not in screen
    assert tmux.cursor_visible()


def test_step_delay_lets_the_table_grow_visibly(tmux, model_dirs, tmp_path):
    prompts = write(tmp_path / "p.jsonl", LESSON)
    tmux.start(trace_command(prompts, "--model", model_dirs["llama"], "--max-running", "2", "--step-delay", "0.6"))
    tmux.wait_for("running…")
    seen = set()
    deadline = time.monotonic() + HANG_LIMIT_S
    while time.monotonic() < deadline:
        screen = tmux.screen()
        if "EXIT=" in screen:
            break
        seen.add(len(rows_on_screen(screen)))
        time.sleep(0.15)
    assert "EXIT=0" in tmux.screen()
    assert len({n for n in seen if n > 0}) >= 3  # the live table was seen at several sizes, not all at once


def minisgl_command(*args: object) -> str:
    return shlex.join([sys.executable, "-m", "minisgl_cli", *map(str, args)])


def test_generate_from_stdin_on_a_terminal_says_how_to_end(tmux, model_dirs):
    tmux.start(minisgl_command("generate", "-", "--model", model_dirs["llama"], "-n", "2"))
    tmux.wait_for("end with Ctrl-D")
    tmux("send-keys", "-t", "t", "hello there", "Enter")
    tmux("send-keys", "-t", "t", "C-d")
    screen = tmux.wait_for("EXIT=")
    assert "EXIT=0" in screen and "length · 2 generated" in screen


def test_ctrl_c_in_generate_keeps_the_finished_results(tmux, model_dirs, tmp_path):
    """The bar counts tokens while the requests run one at a time; Ctrl-C once some have finished prints those
    whole, marks the others interrupted and exits 130. The JSON lines are written to a file, the bar stays on
    the terminal. (Eight prompts, so that the stretch between the first finish and the last is seconds long,
    not one request's half second that a screen polled every 0.2 s can miss.)"""
    count, tokens = 8, 480
    prompts = write(tmp_path / "p.txt", "".join(f"prompt {i}\n" for i in range(count)))
    out = tmp_path / "out.jsonl"
    tmux.start(paced(minisgl_command("generate", prompts, "--model", model_dirs["llama"], "--max-running", "1", "-n",
                                     str(tokens), "--ignore-eos", "--json")) + f" > {shlex.quote(str(out))}")
    _, moving = tmux.wait_for_match(rf"tokens · [0-{count - 1}]/{count} requests")
    assert f"/{count * tokens} tokens" in moving  # per token, before the run has finished
    tmux.wait_for_match(rf"tokens · [1-{count - 1}]/{count} requests")
    tmux("send-keys", "-t", "t", "C-c")
    screen = tmux.wait_for("EXIT=")
    assert "EXIT=130" in screen and "Traceback" not in screen
    finished = int(re.search(rf"interrupted: (\d+) of {count} prompts had finished", screen).group(1))
    assert 1 <= finished < count
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == count
    assert all(r["finish_reason"] == "length" and len(r["token_ids"]) == tokens for r in rows[:finished])
    assert [r["finish_reason"] for r in rows[finished:]] == ["interrupted"] * (count - finished)


def test_a_single_prompt_streams_on_a_terminal(tmux, model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "stream me\n")
    tmux.start(paced(minisgl_command("generate", prompts, "--model", model_dirs["llama"], "-n", "480", "--ignore-eos")))
    deadline = time.monotonic() + HANG_LIMIT_S
    streamed = False
    while time.monotonic() < deadline and not streamed:
        screen = tmux.screen()
        after_prompt = screen.split("stream me", 1)[1] if "stream me" in screen else ""
        streamed = bool(after_prompt.strip()) and "generated" not in screen  # text so far, not yet finished
        time.sleep(0.2)
    assert streamed, tmux.screen()
    screen = tmux.wait_for("EXIT=")
    assert "EXIT=0" in screen and "length · 480 generated" in screen and "summary" in screen
