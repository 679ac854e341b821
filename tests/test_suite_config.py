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
