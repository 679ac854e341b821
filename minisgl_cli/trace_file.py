"""The ``--trace-out`` file of a live run: render/trace_format.py writes it; this opens it as the option asks.

Every step is one flushed line, so an interrupted run leaves a valid file (without the results line)."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable
from typing import Any

import typer

from core.events import StepEvent
from render.trace_format import TraceHeader, TraceWriter


class TraceFile:
    """Opened, and its header written, before the model loads, so an unwritable path fails at once."""

    def __init__(self, path: Path, header: TraceHeader) -> None:
        self.path = path
        self.lines = 0  # step events written
        self.decode: Callable[[list[int]], str] | None = None  # the tokenizer, once loaded: radix spans as text
        try:
            self._writer = TraceWriter(path, header)
        except OSError as exc:
            raise typer.BadParameter(f"cannot write {path}: {exc.strerror or exc}",
                                     param_hint="'--trace-out'") from None

    def write(self, event: StepEvent) -> None:
        self._writer.write_step(event, self.decode)
        self.lines += 1

    def write_results(self, results: list[dict[str, Any]]) -> None:
        self._writer.write_results(results)

    def close(self) -> None:
        self._writer.close()
