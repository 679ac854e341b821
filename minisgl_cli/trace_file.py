"""Writing step events as JSON lines, one flushed line per step, so an interrupted run leaves a valid file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

import typer

from core.events import StepEvent


class TraceFile:
    """Opened before the model loads, so an unwritable path fails at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0
        try:
            self._file: TextIO = open(path, "w", encoding="utf-8")
        except OSError as exc:
            raise typer.BadParameter(f"cannot write {path}: {exc.strerror or exc}",
                                     param_hint="'--trace-out'") from None

    def write(self, event: StepEvent) -> None:
        self._file.write(json.dumps(event.to_dict()) + "\n")  # one write per line: never half a record
        self._file.flush()
        self.lines += 1

    def close(self) -> None:
        self._file.close()
