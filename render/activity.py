"""What a command is doing, on stderr, whether or not anyone is watching a terminal.

On a terminal a spinner line names the current phase and lasting notes print above it. Anywhere else (stderr
piped or sent to a log) each phase and note is one plain line as it starts, so a long run is never silent and
a log says where the time went. stdout is left alone either way: it carries only the results.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.status import Status


class Activity:
    def __init__(self, console: Console) -> None:
        self.console = console
        self._status: Status | None = None
        self._closing: str | None = None  # notes from the first one starting with this are the phase's outcome
        self._held: list[str] = []

    @property
    def live(self) -> bool:
        """A terminal that can show a spinner and bars redrawn in place."""
        return self.console.is_terminal

    @contextmanager
    def phase(self, text: str, closing: str | None = None) -> Iterator[None]:
        """A spinner naming ``text`` on a terminal; elsewhere the line ``text…`` when it starts and how long it
        took when it ends. Notes from the first that starts with ``closing`` on say what the phase came to (the
        engine's ready line): they are held and printed after its end, below the load line and never beside a
        spinner's last frame."""
        self._closing, self._held = closing, []
        try:
            if self.live:
                with self.console.status(escape(text)) as status:
                    self._status = status
                    try:
                        yield
                    finally:
                        self._status = None
            else:
                started = time.perf_counter()
                self.line(f"{text}…")
                yield
                self.line(f"{text}: done in {time.perf_counter() - started:.1f} s")
        finally:
            held, self._closing, self._held = self._held, None, []
        for message in held:
            self.note(message)

    def update(self, text: str) -> None:
        """A new text for the spinner of the current phase (a terminal only: a log does not need every step)."""
        if self._status is not None:
            self._status.update(escape(text))

    def note(self, message: str) -> None:
        """A message that stays (on a terminal, dim above the spinner, which then shows it too)."""
        if self._held or (self._closing is not None and message.startswith(self._closing)):
            self._held.append(message)
        elif self.live:
            # wrapped by Rich, at word boundaries: a line the terminal wrapped itself would leave the spinner's
            # frame behind, since the live display would not know it took two rows
            self.console.print(f"[dim]{escape(message)}[/]")
            if self._status is not None:
                self._status.update(escape(message))
        else:
            self.line(message)

    def line(self, message: str) -> None:
        """One line, never wrapped where stderr is not a terminal (a log's line stays one line)."""
        self.console.print(message, markup=False, highlight=False, soft_wrap=not self.live)
