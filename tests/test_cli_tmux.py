"""The live trace in a real terminal: run ``minisgl trace`` inside tmux and read the screen back.

Skipped where tmux is not installed. Each test uses its own tmux server (a private socket), so nothing else
running tmux on the machine is touched. Waiting is by polling the screen for a marker, with a generous limit
that only guards against a hang; nothing here measures speed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_support import write

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

REPO = Path(__file__).resolve().parents[1]
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
        deadline = time.monotonic() + HANG_LIMIT_S
        while time.monotonic() < deadline:
            screen = self.screen()
            if marker in screen:
                return screen
            time.sleep(0.5)
        raise AssertionError(f"{marker!r} never appeared; the screen was:\n{self.screen()}")

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


def test_live_trace_in_a_terminal(tmux, model_dirs, tmp_path):
    prompts = write(tmp_path / "p.jsonl", '{"prompt": "alpha", "max_tokens": 4}\n{"prompt": "beta", "max_tokens": 2}\n')
    tmux.start(trace_command(prompts, "--model", model_dirs["llama"]))
    screen = tmux.wait_for("EXIT=")
    assert "EXIT=0" in screen
    for part in ("scheduled batches", "prefill", "decode", "uid0:5 uid1:4", "generations", "request timeline",
                 "PDDD", "PD"):
        assert part in screen, part
    assert "running…" not in screen  # the live view was replaced by the final tables, not left behind
    assert tmux.cursor_visible()


def test_ctrl_c_in_a_terminal_leaves_it_clean_and_the_trace_valid(tmux, model_dirs, tmp_path):
    prompts = write(tmp_path / "p.txt", "one\ntwo\nthree\n")
    out = tmp_path / "trace.jsonl"
    tmux.start(trace_command(prompts, "--model", model_dirs["llama"], "--max-running", "1", "-n", "480",
                             "--trace-out", out))
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
