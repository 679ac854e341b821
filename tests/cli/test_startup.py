"""Answering at once, and never in silence: ``--help``, ``--version`` and usage errors load no torch, and the
loading spinner starts before torch is imported (what a piped ``bench`` says on stderr: tests/cli/test_bench.py).

Nothing here is timed (speed is measured by scripts/cli_startup.py); what is checked is the cause of a slow
start, the modules a command imports before it answers."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "core.llm.llm")

PROBE = """
import sys
from minisgl_cli.app import app
try:
    app(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print("\\n" + repr((code, sorted(m for m in {heavy!r} if m in sys.modules))))
"""


def imported_by(*args: str) -> tuple[int, list[str], str]:
    done = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *args], capture_output=True, text=True,
                          timeout=120)
    code, modules = eval(done.stdout.strip().splitlines()[-1])
    return code, modules, done.stdout + done.stderr


def test_help_version_and_usage_errors_import_no_engine(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    for args, expected in [(["--help"], 0), (["--version"], 0), (["generate", "--help"], 0), (["bench", "--help"], 0),
                           (["generate", str(prompts), "--max-tokens", "abc"], 2),
                           (["generate", str(tmp_path / "missing.txt")], 2),
                           (["bench", "--baselines", "hf-fast"], 2),
                           (["generate", str(prompts), "--model", "nobody/nothing"], 2),
                           (["trace", str(prompts), "--svg", str(tmp_path)], 2)]:
        code, modules, output = imported_by(*args)
        assert code == expected, (args, output)
        assert modules == [], (args, modules)


PHASES = """
import sys
from render.activity import Activity
seen = []
phase = Activity.phase
def recorded(self, text, **options):
    seen.append((text, "torch" in sys.modules))
    return phase(self, text, **options)
Activity.phase = recorded
from minisgl_cli.app import app
try:
    app(sys.argv[1:])
except SystemExit:
    pass
print("\\n" + repr(seen))
"""


def test_the_loading_spinner_starts_before_torch_is_imported(model_dirs, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    done = subprocess.run([sys.executable, "-c", PHASES, "generate", str(prompts), "--model", model_dirs["llama"],
                           "-n", "1"], capture_output=True, text=True, timeout=300)
    seen = eval(done.stdout.strip().splitlines()[-1])
    assert seen[0] == (f"loading {model_dirs['llama']}", False), done.stdout + done.stderr
