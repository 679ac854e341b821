"""Shared look: one color per phase, and text made safe for one-line table cells."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

PHASE_STYLE = {"prefill": "bold cyan", "decode": "bold green"}
FINISH_STYLE = {"length": "yellow", "stop": "green", "error": "bold red", "abort": "red"}


def one_line(text: str, style: str = "") -> Text:
    """Text with newlines and tabs shown as visible escapes, so a completion stays on its row."""
    out = Text(style=style)
    for i, part in enumerate(text.split("\n")):
        if i:
            out.append("\\n", style="dim")
        out.append(part.replace("\t", "\\t"))
    return out


def show_edges(text: str) -> str:
    """A completion that is only spaces, and spaces at its end, as ␣: in a table cell they are invisible."""
    body = text.rstrip(" ")
    return body + "␣" * (len(text) - len(body))


def titled_table(title: str, caption: str | None = None, **kwargs: object) -> Table:
    """The one table look: bold title on the left, a rule under the header, no outer frame, compact columns."""
    return Table(title=title, caption=caption, title_justify="left", caption_justify="left", title_style="bold",
                 box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True, **kwargs)
