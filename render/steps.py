"""The step table: one row per scheduled batch, as the scheduler reports it in its step events.

``LiveSteps`` is the same table for ``rich.live.Live``: it shows only the newest rows that fit the terminal,
so a long run scrolls instead of overflowing the screen, and under them the newest step's queue with the
reason each request waits, the KV pool bar, the radix tree when asked, and a legend of the columns. The full
table is printed once the run ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from core.words import plural
from core.events import StepEvent
from render.step_detail import WAIT_WORDS, detail_height, legend, step_detail
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


def wait_cell(event: StepEvent) -> Text:
    """How many wait, and in two words why the first of them does: ``3 · no row``, ``1 · no KV``."""
    out = Text(str(event.waiting))
    if event.waits:
        out.append(f" · {WAIT_WORDS.get(event.waits[0].kind, event.waits[0].kind)}", style="yellow")
    return out


def has_late_arrivals(events: Sequence[StepEvent]) -> bool:
    """Did any request arrive after the run's first step? Only then is the ``new`` column worth its room."""
    return any(e.arrived for e in events[1:])


def step_row(event: StepEvent, show_cached: bool, with_arrivals: bool = False) -> list[Text | str]:
    finished = " ".join(f"uid{u}" for u in event.finished)
    row: list[Text | str] = [str(event.step), Text(event.phase, style=PHASE_STYLE.get(event.phase, "")),
                             str(event.batch_size), str(event.num_tokens), requests_cell(event, show_cached)]
    if with_arrivals:
        row.append(Text(" ".join(f"uid{u}" for u in event.arrived), style="blue"))
    return row + [f"{event.kv_pages_used}/{event.kv_pages_total}", wait_cell(event), Text(finished, style="dim"),
                  f"{event.elapsed_s * 1000:.0f}", Text(event.note, style="yellow")]


def step_columns(events: Sequence[StepEvent], show_cached: bool, with_arrivals: bool | None = None) -> list[str]:
    names = ["step", "phase", "bs", "tokens", "uid:extend_len" + (" (+cached)" if show_cached else "")]
    if has_late_arrivals(events) if with_arrivals is None else with_arrivals:
        names.append("new")
    return names + ["KV pages", "wait", "done", "ms"]


def step_table(events: Sequence[StepEvent], show_cached: bool = False, caption: str | None = None,
               title: str = "scheduled batches", with_arrivals: bool | None = None) -> Table:
    table = titled_table(title, caption)
    arrivals = has_late_arrivals(events) if with_arrivals is None else with_arrivals
    # numbers keep every digit (no_wrap: a narrow screen squeezes the request lists instead)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("phase", no_wrap=True)
    table.add_column("bs", justify="right", no_wrap=True)
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("uid:extend_len" + (" (+cached)" if show_cached else ""), overflow="fold")
    if arrivals:
        table.add_column("new", overflow="fold", max_width=4)
    table.add_column("KV pages", justify="right", no_wrap=True)
    table.add_column("wait", justify="right", no_wrap=True)
    table.add_column("done", overflow="fold")
    table.add_column("ms", justify="right", no_wrap=True)
    with_notes = any(e.note for e in events)
    if with_notes:
        table.add_column("note", overflow="fold")
    for event in events:
        row = step_row(event, show_cached, arrivals)
        table.add_row(*(row if with_notes else row[:-1]))
    return table


def legend_for(events: Sequence[StepEvent], show_cached: bool, with_arrivals: bool | None = None) -> Table:
    """One line for each column the table shows."""
    names = {"uid:extend_len" if n.startswith("uid:") else n
             for n in step_columns(events, show_cached, with_arrivals)}
    return legend(names)


class LiveSteps:
    """A growing step table for a live display; call ``add`` for each event and refresh the Live."""

    def __init__(self, show_cached: bool = False, total_requests: int = 0, show_legend: bool = False,
                 show_radix: bool = False, decode: Callable[[list[int]], str] | None = None,
                 arrivals_expected: bool = False) -> None:
        self.events: list[StepEvent] = []
        self.show_cached = show_cached
        self.total_requests = total_requests
        self.finished = 0
        self.show_legend = show_legend
        self.show_radix = show_radix
        self.decode = decode
        self.arrivals_expected = arrivals_expected  # keep the ``new`` column from the first row on
        self.hint = ""  # e.g. which keys move the trace on

    def add(self, event: StepEvent) -> None:
        self.events.append(event)
        self.finished += len(event.finished)

    def caption(self, hidden: int = 0) -> str:
        parts = [plural(len(self.events), "step"), f"{self.finished}/{plural(self.total_requests, 'request')} finished"]
        if hidden:
            parts.append(f"{plural(hidden, 'earlier step')} scrolled off")
        return " · ".join(parts + ([self.hint] if self.hint else [])) + " · running…"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        newest = self.events[-1] if self.events else None
        below = detail_height(newest, self.show_radix, self.show_legend)
        room = max(3, (options.height or console.size.height) - _CHROME_ROWS - below)
        shown = self.events[-room:]
        arrivals = self.arrivals_expected or has_late_arrivals(self.events)
        parts = [step_table(shown, self.show_cached, caption=self.caption(len(self.events) - len(shown)),
                            with_arrivals=arrivals)]
        if newest is not None:
            parts.append(step_detail(newest, self.show_radix, self.decode))
        if self.show_legend:
            parts.append(legend_for(self.events, self.show_cached, arrivals))
        yield Group(*parts)
