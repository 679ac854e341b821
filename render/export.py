"""Saving a screen as SVG: the renderables are printed again to a recording console and exported by Rich."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console, RenderableType

SVG_WIDTH = 110


def save_svg(renderables: Iterable[RenderableType], path: Path | str, title: str = "minisgl",
             width: int = SVG_WIDTH) -> None:
    console = Console(record=True, width=width, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    for renderable in renderables:
        console.print(renderable)
    console.save_svg(str(path), title=title)
