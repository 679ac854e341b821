"""Progress of a generation: tokens produced out of the most that can be, and requests finished out of all.

The bar counts tokens, so it moves with every token rather than only when a request ends; when a request
stops early (at an end-of-sequence token, or with an error) the tokens it will no longer use are counted as
done, so the bar still ends full. On a terminal it is a transient bar (gone when done); elsewhere one line
when generation starts and one when it ends, on stderr, so piped results stay clean and a log shows the run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from core.words import plural
from render.activity import Activity


class GenerationProgress:
    """A context manager; call ``advance`` for every token and every finished request."""

    def __init__(self, activity: Activity, budgets: Sequence[int], description: str = "generating") -> None:
        self.tokens = 0
        self.finished = 0
        self.requests = len(budgets)
        self._activity = activity
        self._description = description
        self._started = 0.0
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TextColumn("tokens · {task.fields[finished]}/"
                                                                   + plural(self.requests, "request")),
                                  TimeElapsedColumn(), console=activity.console, transient=True,
                                  disable=not activity.live)
        self._task = self._progress.add_task(description, total=sum(budgets), finished=0)

    def advance(self, tokens: int, finished: bool = False, unused: int = 0) -> None:
        """``tokens`` new ones; a request that ``finished`` with ``unused`` of its budget left."""
        self.tokens += tokens
        self.finished += finished
        self._progress.update(self._task, advance=tokens + unused, finished=self.finished)

    def __enter__(self) -> "GenerationProgress":
        self._started = time.perf_counter()
        if self._activity.live:
            self._progress.start()
        else:
            self._activity.line(f"{self._description}: {plural(self.requests, 'request')}…")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._activity.live:
            self._progress.stop()
            return
        self._activity.line(f"{self._description}: {self.finished}/{plural(self.requests, 'request')} finished, "
                            f"{plural(self.tokens, 'token')} in {time.perf_counter() - self._started:.1f} s")
