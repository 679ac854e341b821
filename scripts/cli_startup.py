"""How long ``minisgl`` takes to start, each command beside its floor in the same run.

    .venv/bin/python scripts/cli_startup.py [--runs 5] [--skip-answers | --skip-generate]

Every command runs as a fresh process and the median wall time of each is printed. Two parts:

* answers before a model loads (``--help``, ``--version``, usage errors), beside ``import typer, rich``: what any
  Typer + Rich command line pays before its first line of output;
* a warm start of ``minisgl generate`` on the embedded model (one prompt, one token; the GGUF converted and the
  kernels' derived tensors cached by a first run, not timed), beside ``import torch, transformers``: what any
  program that runs a transformers model pays before it loads one. The runs of the two alternate, so a busy
  machine slows both alike, and the ratio of the medians is printed last.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MINISGL = [sys.executable, "-m", "minisgl_cli"]
ANSWERS = {
    "python -c 'import typer, rich'": [sys.executable, "-c", "import typer, rich"],
    "minisgl --help": [*MINISGL, "--help"],
    "minisgl --version": [*MINISGL, "--version"],
    "minisgl generate p.txt --max-tokens abc": [*MINISGL, "generate", "{prompts}", "--max-tokens", "abc"],
    "minisgl generate missing.txt": [*MINISGL, "generate", "missing.txt"],
}
FLOOR = "python -c 'import torch, transformers'"
WARM = "minisgl generate p.txt --max-tokens 1"
STARTS = {
    FLOOR: [sys.executable, "-c", "import torch, transformers"],
    WARM: [*MINISGL, "generate", "{prompts}", "--max-tokens", "1"],
}


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, cwd=ROOT)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr.decode(errors='replace')}")
    return elapsed


def measure(cases: dict[str, list[str]], runs: int, prompts: Path, check: bool) -> dict[str, float]:
    """The median seconds of each case, its runs interleaved with the other cases'."""
    commands = {name: [part.format(prompts=prompts) for part in command] for name, command in cases.items()}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, command in commands.items():
            if check:
                times[name].append(timed(command))
            else:
                started = time.perf_counter()
                subprocess.run(command, capture_output=True, cwd=ROOT)
                times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--skip-answers", action="store_true", help="only the warm start of generate")
    parser.add_argument("--skip-generate", action="store_true", help="only the answers before a model loads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "p.txt"
        prompts.write_text("hello\n")
        if not args.skip_answers:
            for name, seconds in measure(ANSWERS, args.runs, prompts, check=False).items():
                print(f"{name:<45} {seconds * 1000:7.0f} ms (median of {args.runs})")
        if not args.skip_generate:
            timed([part.format(prompts=prompts) for part in STARTS[WARM]])  # warm-up: converts and caches once
            medians = measure(STARTS, args.runs, prompts, check=True)
            for name, seconds in medians.items():
                print(f"{name:<45} {seconds * 1000:7.0f} ms (median of {args.runs})")
            print(f"{'warm start / import torch, transformers':<45} {medians[WARM] / medians[FLOOR]:7.2f}x")


if __name__ == "__main__":
    main()
