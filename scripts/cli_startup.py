"""How long ``minisgl`` takes to answer before it loads a model, beside ``import typer, rich`` in the same run.

    .venv/bin/python scripts/cli_startup.py [--runs 5]

Each command runs as a fresh process; the median wall time of each is printed. ``import typer, rich`` is the
floor: what any Typer + Rich command line pays before its first line of output.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "python -c 'import typer, rich'": [sys.executable, "-c", "import typer, rich"],
    "minisgl --help": [sys.executable, "-m", "minisgl_cli", "--help"],
    "minisgl --version": [sys.executable, "-m", "minisgl_cli", "--version"],
    "minisgl generate p.txt --max-tokens abc": [sys.executable, "-m", "minisgl_cli", "generate", "{prompts}",
                                                "--max-tokens", "abc"],
    "minisgl generate missing.txt": [sys.executable, "-m", "minisgl_cli", "generate", "missing.txt"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "p.txt"
        prompts.write_text("hello\n")
        for name, command in CASES.items():
            command = [part.format(prompts=prompts) for part in command]
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                subprocess.run(command, capture_output=True, cwd=Path(__file__).resolve().parents[1])
                times.append(time.perf_counter() - started)
            print(f"{name:<45} {statistics.median(times) * 1000:7.0f} ms (median of {runs})")


if __name__ == "__main__":
    main()
