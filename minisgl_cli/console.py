"""The consoles a command prints on: results on stdout (as wide as the terminal, or a fixed width when stdout is not
one), and what it is doing on stderr."""

from __future__ import annotations

import os

from rich.console import Console

PIPED_WIDTH = 120  # columns of a table written to a pipe or a file (Rich's default, 80, squeezes the trace's)


def stdout_console() -> Console:
    """Where results go: on a terminal as wide as it is; piped or redirected, ``$COLUMNS`` wide when it is set,
    else PIPED_WIDTH."""
    out = Console()
    if not out.is_terminal and not os.environ.get("COLUMNS"):
        out = Console(width=PIPED_WIDTH)
    return out


def stderr_console() -> Console:
    """Where a command says what it is doing: on a terminal Rich wraps long lines at word boundaries; anywhere
    else (a pipe, a log file) a line is never cut in two."""
    err = Console(stderr=True)
    return err if err.is_terminal else Console(stderr=True, soft_wrap=True)
