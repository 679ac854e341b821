"""A prompt as it is echoed above its result: whole when short, cut to one line when long.

A refused 10,000-word prompt would otherwise fill hundreds of lines before its one-line error. The head and
the tail are kept, so a continuation still reads on from where the prompt ended; the full prompt is in
``--json`` output and in the file it came from.
"""

from __future__ import annotations

from typing import Callable

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.text import Text

from render.style import one_line
from core.words import plural

MAX_CHARS = 300  # a prompt longer than this, or of more than MAX_LINES lines, is cut
MAX_LINES = 2
HEAD_CHARS = 120
TAIL_CHARS = 60


CELL_MIN_CHARS = 8  # a prompt cell shrinks to this before a table squeezes anything else


def cut_middle(text: str, head: int, tail: int, marker: Callable[[int], str] = lambda hidden: "…") -> str:
    """``text``'s first ``head`` characters (up to its first newline) and its last ``tail`` (from its last newline)
    around ``marker(how many characters are left out)``. Keeping the tail as well as the head means a
    continuation still reads on from where the prompt ended, and prompts that differ only at the end look
    different."""
    first = text[:head].split("\n")[0]
    last = text[-tail:].split("\n")[-1] if tail > 0 else ""
    return f"{first}{marker(len(text) - len(first) - len(last))}{last}"


def echo_prompt(prompt: str) -> str:
    if len(prompt) <= MAX_CHARS and prompt.count("\n") < MAX_LINES:
        return prompt
    return cut_middle(prompt, HEAD_CHARS, TAIL_CHARS,
                      lambda hidden: f" [… {plural(hidden, 'character')} not shown …] ")


class PromptCell:
    """A prompt in a table cell: on one line (newlines shown as ``\\n``), cut in the middle to the width the table
    gives it (``cut_middle``: two thirds head, one third tail). It is the column that shrinks on a narrow screen,
    down to CELL_MIN_CHARS, so the numbers beside it keep every digit."""

    def __init__(self, prompt: str) -> None:
        self.text = one_line(prompt)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        length = self.text.cell_len
        return Measurement(min(length, CELL_MIN_CHARS), min(length, options.max_width))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(1, options.max_width)
        if self.text.cell_len <= width:
            yield self.text
            return
        shown = width - 1
        head = max(1, shown * 2 // 3) if shown else 0
        yield Text(cut_middle(self.text.plain, head, shown - head), no_wrap=True, overflow="ellipsis")
