"""Ctrl-C as a user presses it (SIGINT to a real ``minisgl`` process): a line that says what was stopped, what
was measured before it, and exit code 130."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.cli import interrupt_after

ROOT = Path(__file__).resolve().parents[2]


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "minisgl_cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})


def test_ctrl_c_while_the_model_loads_says_so(model_dirs, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    # "loading ..." is printed before torch is imported: the signal lands during the load
    process = start("generate", str(prompts), "--model", model_dirs["llama"])
    out, err = interrupt_after(process, "loading ")
    assert process.returncode == 130, err
    assert "interrupted while loading the model" in err
    assert "Traceback" not in err and out == ""


def test_ctrl_c_in_bench_prints_what_was_measured(model_dirs):
    args = ("bench", "--model", model_dirs["llama"], "--requests", "4", "--threads", "1")
    table, as_json = start(*args), start(*args, "--json")  # side by side: each runs on one thread
    with ThreadPoolExecutor(2) as pool:  # each Ctrl-C as soon as its own process says a baseline is under way
        table_run, json_run = pool.map(lambda process: interrupt_after(process, "bench: hf-"), (table, as_json))
    out, err = table_run  # the engine has been measured; a baseline is under way
    assert table.returncode == 130, err
    assert "interrupted: the 1 run measured before Ctrl-C" in out or "runs measured before Ctrl-C" in out, out
    assert "minisgl" in out
    out, err = json_run
    assert as_json.returncode == 130, err
    report = json.loads(out)
    assert report["interrupted"] is True
    assert report["results"][0]["name"] == "minisgl" and report["results"][0]["output_tokens"] > 0
    assert "the runs measured so far follow" in err


def test_ctrl_c_while_bench_loads_says_so(model_dirs):
    process = start("bench", "--model", model_dirs["llama"], "--requests", "4")
    out, err = interrupt_after(process, "loading torch")
    assert process.returncode == 130, err
    assert "interrupted while loading the model" in err
    assert "Traceback" not in err and out == ""
