"""Results on stdout, faithful wherever they go.

On a terminal Rich draws them, and a long line is left for the terminal to wrap (soft wrap), so no newline is
ever inserted into a completion. Piped or redirected, a completion is written as plain text, byte for byte
what the model produced: Rich would hard-wrap it at 80 columns and expand its tabs.
"""

from __future__ import annotations

from rich.console import Console

from render.results import Result, completion_body, completion_header, completion_plain


def print_completion(out: Console, index: int, total: int, label: str, result: Result, separator: str = "") -> None:
    out.print(completion_header(index, total, result))
    if out.is_terminal:
        out.print(completion_body(label, result, separator), soft_wrap=True)
    else:
        out.file.write(completion_plain(label, result, separator) + "\n")
        out.file.flush()
