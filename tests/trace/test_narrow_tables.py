"""Tables keep every digit, whatever the width: ``minisgl trace`` redirected to a file, and its replay on an
80-column screen, show the ``ms`` column whole (header and values), timeline rows on one line each, and the
prompts cut in the middle, so prompts that differ only at their end still look different."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.cli import trace_steps

ROOT = Path(__file__).resolve().parents[2]
SHARED_PREFIX = ROOT / "sample_prompts" / "shared_prefix.txt"


def minisgl(tmp_path: Path, *args: str, columns: str | None = None) -> str:
    """Run the real command with its stdout redirected to a file (not a terminal); return what it wrote."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = columns
    out = tmp_path / "stdout.txt"
    with out.open("w") as f:
        done = subprocess.run([sys.executable, "-m", "minisgl_cli", *args], stdout=f, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    return out.read_text()


def step_lines(stdout: str) -> tuple[str, list[list[str]]]:
    """The step table's header line and its rows' cells."""
    table = stdout.split("generations")[0].splitlines()
    header = next(line for line in table if line.split()[:2] == ["step", "phase"])
    rows = [line.split() for line in table if line.split()[:1] and line.split()[0].isdigit()
            and line.split()[1] in ("prefill", "decode")]
    return header, rows


def assert_whole_ms(stdout: str, trace: Path) -> None:
    header, rows = step_lines(stdout)
    assert header.split()[-1] == "ms", header
    expected = [f"{e['elapsed_s'] * 1000:.0f}" for e in trace_steps(trace)]
    assert [row[-1] for row in rows] == expected


def timeline_rows(stdout: str) -> list[str]:
    timeline = stdout.split("request timeline")[1].splitlines()
    return [line for line in timeline if line.split()[:1] and line.split()[0].isdigit()]


def test_ms_and_prompts_survive_a_file_and_80_columns(smollm2_dir, tmp_path):
    trace = tmp_path / "run.jsonl"
    piped = minisgl(tmp_path, "trace", str(SHARED_PREFIX), "--max-tokens", "3", "--no-legend",
                    "--trace-out", str(trace))
    assert_whole_ms(piped, trace)
    for stdout in (piped, minisgl(tmp_path, "trace", "--replay", str(trace), "--no-legend", columns="80")):
        assert_whole_ms(stdout, trace)
        timeline = timeline_rows(stdout)
        assert [row.split()[0] for row in timeline] == ["0", "1", "2"]  # one line per request, none wrapped
        for section in ("generations", "request timeline"):
            prompts = [line for line in stdout.split(section)[1].splitlines() if "You are" in line][:3]
            tails = [line.split("…")[1].split()[0] for line in prompts]
            assert len(set(tails)) == 3, prompts  # France?, Italy?, Spain?: each prompt's end is shown
