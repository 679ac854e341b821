"""Output paths are checked before anything is loaded or run, so a typo costs milliseconds, not a whole run."""

from __future__ import annotations

import os
from pathlib import Path

import typer


def check_output_file(path: Path | None, option: str) -> None:
    """A file that can be created or overwritten: not a directory, in a directory that exists and is
    writable. Raises Click's BadParameter, which the app shows as one line and exit code 2."""
    if path is None:
        return

    def bad(why: str) -> typer.BadParameter:
        return typer.BadParameter(why, param_hint=f"'{option}'")

    if path.is_dir():
        raise bad(f"{path} is a directory; give a file name")
    parent = path.parent.resolve()
    if not parent.is_dir():
        raise bad(f"directory {path.parent} does not exist")
    if path.exists() and not os.access(path, os.W_OK):
        raise bad(f"cannot write {path}: permission denied")
    if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise bad(f"cannot write in {path.parent}: permission denied")
