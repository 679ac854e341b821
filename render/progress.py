"""A progress bar fed by the engine's replies: requests finished out of all, and tokens generated so far."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class GenerationProgress:
    """Use as a context manager and register ``on_reply`` as the LLM's reply callback.

    Shown only on a terminal (transient: it disappears when done), so piped output and logs stay clean.
    """

    def __init__(self, console: Console, total: int, description: str = "generating") -> None:
        self.tokens = 0
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TextColumn("requests · {task.fields[tokens]} tokens"),
                                  TimeElapsedColumn(), console=console, transient=True,
                                  disable=not console.is_terminal)
        self._task = self._progress.add_task(description, total=total, tokens=0)

    def on_reply(self, reply: Any) -> None:
        if reply.token is not None and reply.finish_reason != "stop":  # a stop token is not output
            self.tokens += 1
        self._progress.update(self._task, advance=1 if reply.finished else 0, tokens=self.tokens)

    def __enter__(self) -> "GenerationProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()
