"""Pace for the live trace: a pause after every step, or a key press before each one.

Both only make sense with a person at a terminal: without one (piped, in CI) they are ignored, with one line on
stderr that says so, and the run goes at full speed.
"""

from __future__ import annotations

import os
import sys
import termios
import time
import tty
from dataclasses import dataclass

from rich.console import Console

NEXT_KEYS = ("\r", "\n", " ")
QUIT_KEYS = ("q", "Q")
STEP_HINT = "Enter or space: next step · q: stop"


class StopRequested(Exception):
    """The person at the terminal pressed q: end the run cleanly after the step on screen."""


def read_key(fd: int) -> str:
    """One key press, without waiting for Enter and without echo (Ctrl-C still interrupts)."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        return os.read(fd, 1).decode(errors="replace")
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@dataclass
class Pacer:
    delay_s: float = 0.0
    step_by_key: bool = False

    @classmethod
    def for_terminal(cls, delay_s: float, step_by_key: bool, err: Console) -> "Pacer":
        if not (delay_s or step_by_key):
            return cls()
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            asked = "--step" if step_by_key else "--step-delay"
            err.print(f"[dim]{asked} needs a terminal; running at full speed[/]")
            return cls()
        return cls(delay_s, step_by_key)

    @property
    def active(self) -> bool:
        return bool(self.delay_s or self.step_by_key)

    def before_step(self) -> None:
        """Called with the table on screen, before the engine schedules its next step."""
        if self.step_by_key:
            fd = sys.stdin.fileno()
            while True:
                key = read_key(fd)
                if key in QUIT_KEYS:
                    raise StopRequested
                if key in NEXT_KEYS:
                    return

    def after_step(self) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
