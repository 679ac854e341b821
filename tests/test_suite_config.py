"""The suite's own configuration: a run says why each skipped test was skipped (pytest's -rs, in pyproject.toml),
so a summary of hundreds of skips on a machine without CUDA is never silent about the cause."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_lists_the_reason_of_every_skip(tmp_path):
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.skip(reason='needs a flux capacitor')\n"
        "def test_skipped():\n    pass\n\n"
        "def test_runs():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"),
                           "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(tmp_path / "test_skips.py")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIPPED [1]" in done.stdout and "needs a flux capacitor" in done.stdout


def test_the_last_line_counts_the_skips_by_reason():
    from types import SimpleNamespace

    from tests.support.skips import skip_line

    def skipped(reason: str) -> SimpleNamespace:
        return SimpleNamespace(longrepr=("tests/x.py", 3, f"Skipped: {reason}"))

    reports = [skipped("tmux is not installed"), skipped("needs CUDA"), skipped("needs CUDA")]
    assert skip_line(reports, 10) == "skipped 3 of 10: 2 needs CUDA; 1 tmux is not installed"
    assert skip_line([], 10) == ""


def test_the_tools_some_tests_need_are_named_with_their_packages():
    done = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "test_tools.sh")], capture_output=True, text=True,
                          env={"PATH": "/nonexistent"}, timeout=60)
    assert done.returncode == 0 and done.stdout == ""
    for program, packages in (("tmux", "tmux"), ("chromedriver", "chromium chromium-driver"), ("cc", "gcc libgomp1")):
        assert f"no {program}, so the tests of " in done.stderr and f"(apt-get install {packages})" in done.stderr
    assert "scripts/test_tools.sh --install" in done.stderr
