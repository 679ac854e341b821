"""The part of core a learner reads stays small enough to read: no file over MAX_FILE_LINES lines, no function
over MAX_FUNCTION_LINES, no class over MAX_CLASS_LINES.

That part is core/ less kernels/ (the reference table, core/kernels/dispatch.py, and the CPU and CUDA wings of
fast paths, each a plug-in chosen by the plan) and bench/ (``minisgl bench``): the path scheduler -> engine ->
model -> layers -> attention backends. A file or definition that grows past a limit is split by idea.

The packages around core (the server, the views, the command line) are held to looser limits: no file over
WING_FILE_LINES lines, no function over WING_FUNCTION_LINES.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core"
OUTSIDE = ("kernels", "bench")  # packages of core outside the learner's path

MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 250

WINGS = ("serving", "render", "minisgl_cli")  # top-level packages beside core, under the looser limits
WING_FILE_LINES = 400
WING_FUNCTION_LINES = 80


def learner_files() -> list[Path]:
    return sorted(p for p in CORE.rglob("*.py") if p.relative_to(CORE).parts[0] not in OUTSIDE)


def oversized(text: str, name: str, file_lines: int = MAX_FILE_LINES, function_lines: int = MAX_FUNCTION_LINES,
              class_lines: int | None = MAX_CLASS_LINES) -> list[str]:
    """'name: what (lines > limit)' for the file ``text`` and every function or class in it over its limit (a
    class limit of None: classes unlimited)."""
    found = []
    if (lines := len(text.splitlines())) > file_lines:
        found.append(f"{name}: the file ({lines} lines > {file_lines})")
    for node in ast.walk(ast.parse(text, name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
                (isinstance(node, ast.ClassDef) and class_lines is not None):
            kind, limit = (("class", class_lines) if isinstance(node, ast.ClassDef) else
                           ("function", function_lines))
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if (lines := node.end_lineno - first + 1) > limit:
                found.append(f"{name}:{node.lineno}: {kind} {node.name} ({lines} lines > {limit})")
    return found


def test_the_learners_path_is_walked():
    names = {p.relative_to(CORE).as_posix() for p in learner_files()}
    assert {"engine/engine.py", "scheduler/scheduler.py", "models/decoder.py", "layers/attention.py"} <= names
    assert not any(name.startswith(OUTSIDE) for name in names)


def test_no_file_function_or_class_of_the_learners_path_is_over_its_limit():
    over = [line for path in learner_files()
            for line in oversized(path.read_text(), str(path.relative_to(CORE.parent)))]
    assert not over, "over the size limits (split by idea):\n" + "\n".join(over)


def test_the_check_sees_a_long_function():
    """The check itself: a function one line over the limit is named, with its line count."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert oversized(f"def long():\n{body}\n", "probe.py") == [
        f"probe.py:1: function long ({MAX_FUNCTION_LINES + 1} lines > {MAX_FUNCTION_LINES})"]


def wing_files() -> list[Path]:
    return sorted(p for package in WINGS for p in (CORE.parent / package).rglob("*.py"))


def test_no_file_or_function_of_the_server_views_or_command_line_is_over_its_limit():
    assert {"serving/api/app.py", "render/steps.py", "minisgl_cli/app.py"} <= \
        {p.relative_to(CORE.parent).as_posix() for p in wing_files()}
    over = [line for path in wing_files()
            for line in oversized(path.read_text(), str(path.relative_to(CORE.parent)), WING_FILE_LINES,
                                  WING_FUNCTION_LINES, class_lines=None)]
    assert not over, "over the size limits (split by idea):\n" + "\n".join(over)
