"""Running the ``minisgl`` app in-process, as a user would from a shell, for the command line tests."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from minisgl_cli.app import app


def run(*args: str, input: str | None = None):
    """Invoke ``minisgl ARGS``; the result has exit_code, stdout and stderr kept apart. The screen is wide so
    that table cells the tests look for are not wrapped."""
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, [str(a) for a in args], input=input)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def trace_steps(path: Path) -> list[dict]:
    """The step events of a ``--trace-out`` file, as JSON objects (the header and results lines left out)."""
    return [record for record in json_lines(path.read_text()) if record["type"] == "step"]


def assert_user_error(result, fragment: str, after_load: bool = False) -> None:
    """A user mistake: exit 2, one line on stderr that starts with 'error:' and says what was wrong.

    Mistakes found before the model loads leave stderr with that line alone; ``after_load`` ones may follow
    the engine's own progress lines."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert [ln.startswith("error: ") for ln in lines].count(True) == 1, result.stderr
    if not after_load:
        assert len(lines) == 1, result.stderr
    lines = lines[-1:]
    assert lines[0].startswith("error: "), lines[0]
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stdout + result.stderr


def interrupt_after(process: subprocess.Popen, starts: str, timeout_s: float = 120.0) -> tuple[str, str]:
    """Ctrl-C (SIGINT) as soon as the process's stderr has a line starting with ``starts``; then the rest of
    its stdout, and all of its stderr."""
    seen = []
    try:
        for line in process.stderr:
            seen.append(line)
            if line.startswith(starts):
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=timeout_s)
    finally:
        if process.poll() is None:
            process.kill()
    return out, "".join(seen) + err
