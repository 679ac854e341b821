"""``minisgl trace --web``: the run (or a saved trace) on the dashboard page on a local port, served until Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

WAIT_S = 120.0
REPLAY = Path(__file__).resolve().parents[2] / "docs" / "replay.jsonl"


def start(*args: str) -> tuple[subprocess.Popen, str]:
    """The command, once it says the page stays up (the run is over); returns it and the page's URL."""
    proc = subprocess.Popen([sys.executable, "-m", "minisgl_cli", "trace", *args, "--web"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "120"})
    deadline = time.monotonic() + WAIT_S
    url = None
    for line in proc.stderr:
        if line.startswith("watch it at "):
            url = line.split()[-1]
        if "stays at" in line or time.monotonic() > deadline:
            break
    assert url and url.endswith("/dashboard"), url
    return proc, url


def read(url: str, limit: int = 200_000) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read(limit).decode()


def stream_start(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read1(65536).decode() + reply.read1(65536).decode()


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGINT)
    return proc.wait(30)


def test_the_run_stays_on_the_page_until_ctrl_c(model_dirs, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\na b c\n")
    proc, url = start(str(prompts), "--model", model_dirs["llama"], "--max-tokens", "3")
    try:
        page = read(url)
        assert "dashboard-data" in page and "connect-src 'self'" in page
        events = stream_start(url + "/events")
        assert "event: step" in events and '"prompt":"hello there"' in events  # its own prompts: shown
    finally:
        assert stop(proc) == 0


def test_a_saved_trace_is_replayed_on_the_page():
    proc, url = start("--replay", str(REPLAY))
    try:
        page = read(url)
        assert 'id="trace-data"' in page and "default-src 'none'" in page
    finally:
        stop(proc)
