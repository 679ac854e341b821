"""The step table: one row per scheduled batch, as the scheduler reports it in its step events.

``LiveSteps`` is the same table for ``rich.live.Live``: it shows only the newest rows that fit the terminal,
so a long run scrolls instead of overflowing the screen; the full table is printed once the run ends.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from core.events import StepEvent
from render.style import PHASE_STYLE, titled_table

_CHROME_ROWS = 7  # title, header, borders and caption around the rows


def requests_cell(event: StepEvent, show_cached: bool) -> Text:
    """``uid:extend`` for each request; with a prefix cache, a prefill also shows the tokens it reused as
    ``(+cached)``. A request finishing in this step is shown in bold."""
    out = Text()
    for i, req in enumerate(event.reqs):
        if i:
            out.append(" ")
        out.append(f"uid{req.uid}", style="bold" if req.uid in event.finished else "")
        out.append(f":{req.extend_len}")
        if show_cached and event.phase == "prefill" and req.cached_len:
            out.append(f"(+{req.cached_len})", style="magenta")
    return out


def step_row(event: StepEvent, show_cached: bool) -> list[Text | str]:
    finished = " ".join(f"uid{u}" for u in event.finished)
    return [str(event.step), Text(event.phase, style=PHASE_STYLE.get(event.phase, "")), str(event.batch_size),
            str(event.num_tokens), requests_cell(event, show_cached), f"{event.kv_pages_used}/{event.kv_pages_total}",
            str(event.waiting), Text(finished, style="dim"), f"{event.elapsed_s * 1000:.0f}",
            Text(event.note, style="yellow")]


def step_table(events: Sequence[StepEvent], show_cached: bool = False, caption: str | None = None,
               title: str = "scheduled batches") -> Table:
    table = titled_table(title, caption)
    table.add_column("step", justify="right")
    table.add_column("phase")
    table.add_column("bs", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("uid:extend_len" + (" (+cached)" if show_cached else ""), overflow="fold", min_width=16)
    table.add_column("KV pages", justify="right")
    table.add_column("wait", justify="right")
    table.add_column("done", overflow="fold")
    table.add_column("ms", justify="right")
    with_notes = any(e.note for e in events)
    if with_notes:
        table.add_column("note", overflow="fold")
    for event in events:
        row = step_row(event, show_cached)
        table.add_row(*(row if with_notes else row[:-1]))
    return table


class LiveSteps:
    """A growing step table for a live display; call ``add`` for each event and refresh the Live."""

    def __init__(self, show_cached: bool = False, total_requests: int = 0) -> None:
        self.events: list[StepEvent] = []
        self.show_cached = show_cached
        self.total_requests = total_requests
        self.finished = 0

    def add(self, event: StepEvent) -> None:
        self.events.append(event)
        self.finished += len(event.finished)

    def caption(self, hidden: int = 0) -> str:
        parts = [f"{len(self.events)} steps", f"{self.finished}/{self.total_requests} requests finished"]
        if hidden:
            parts.append(f"{hidden} earlier steps scrolled off")
        return " · ".join(parts) + " · running…"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        room = max(3, (options.height or console.size.height) - _CHROME_ROWS)
        shown = self.events[-room:]
        yield step_table(shown, self.show_cached, caption=self.caption(len(self.events) - len(shown)))
