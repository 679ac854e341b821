"""Progress fed by the engine's replies: requests finished out of all, and tokens generated so far.

On a terminal a transient bar (it disappears when done); elsewhere one line when generation starts and one
when it ends, on stderr, so piped results stay clean and a log still shows the run.
"""

from __future__ import annotations

import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from render.activity import Activity


class GenerationProgress:
    """Use as a context manager and register ``on_reply`` as the LLM's reply callback."""

    def __init__(self, activity: Activity, total: int, description: str = "generating") -> None:
        self.tokens = 0
        self.finished = 0
        self.total = total
        self._activity = activity
        self._description = description
        self._started = 0.0
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TextColumn("requests · {task.fields[tokens]} tokens"),
                                  TimeElapsedColumn(), console=activity.console, transient=True,
                                  disable=not activity.live)
        self._task = self._progress.add_task(description, total=total, tokens=0)

    def on_reply(self, reply: Any) -> None:
        if reply.token is not None and reply.finish_reason != "stop":  # a stop token is not output
            self.tokens += 1
        if reply.finished:
            self.finished += 1
        self._progress.update(self._task, advance=1 if reply.finished else 0, tokens=self.tokens)

    def __enter__(self) -> "GenerationProgress":
        self._started = time.perf_counter()
        if self._activity.live:
            self._progress.start()
        else:
            self._activity.line(f"{self._description}: {self.total} requests…")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._activity.live:
            self._progress.stop()
            return
        self._activity.line(f"{self._description}: {self.finished}/{self.total} requests finished, "
                            f"{self.tokens} tokens in {time.perf_counter() - self._started:.1f} s")
