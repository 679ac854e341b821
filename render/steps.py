"""The step table: one row per scheduled batch, as the scheduler reports it in its step events.

``LiveSteps`` is the same table for ``rich.live.Live``: it shows only the newest rows that fit the terminal,
so a long run scrolls instead of overflowing the screen, and under them the newest step's queue with the
reason each request waits, the KV pool bar, the radix tree when asked, and a legend of the columns. The full
table is printed once the run ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from core.words import plural
from core.events import StepEvent
from render.step_detail import SHORT_REASON, WAIT_WORDS, detail_height, legend, step_detail
from render.style import PHASE_STYLE, titled_table

_CHROME_ROWS = 7  # title, header, borders and caption around the rows


# from this width on the table has its full words; narrower, its compact form keeps one line a step at 80 columns
WIDE_COLUMNS = 100
REQUESTS_CHARS, UIDS_CHARS = 12, 6  # a compact cell's most characters; the requests beyond are counted, "+3"
# the compact table's words for a note (the step's note from the scheduler), by how it starts
SHORT_NOTES = {"decode forced": "forced", "prefill kept on": "burst"}
GRAMMAR_MARK = "§"  # after the uid of a request that samples under a grammar (structured output)


def shown_count(items: Sequence[str], most: int) -> int:
    """How many of ``items`` fit in ``most`` characters, joined by spaces, with "+N" for the rest."""
    for n in range(len(items), 0, -1):
        if len(" ".join(items[:n])) + (len(f" +{len(items) - n}") if n < len(items) else 0) <= most:
            return n
    return 0


def uid_list(uids: Sequence[int], compact: bool, style: str = "") -> Text:
    """``uid0 uid3``, or in the compact table ``0 3`` with those that do not fit counted (``0 3 +2``)."""
    if not compact:
        return Text(" ".join(f"uid{u}" for u in uids), style=style)
    items = [str(u) for u in uids]
    n = shown_count(items, UIDS_CHARS)
    return Text((" ".join(items[:n]) + (f" +{len(items) - n}" if n < len(items) else "")).lstrip(), style=style)


def requests_cell(event: StepEvent, show_cached: bool, compact: bool = False) -> Text:
    """``uid:extend`` for each request; with a prefix cache, a prefill also shows the tokens it reused as
    ``(+cached)``. A request finishing in this step is shown in bold. Compact: ``0:5 4:2+3``, the requests that
    do not fit counted."""
    cached = [show_cached and event.phase == "prefill" and req.cached_len for req in event.reqs]
    items = [f"{req.uid}{GRAMMAR_MARK * req.constrained}:{req.extend_len}" + (f"+{c}" if c else "")
             for req, c in zip(event.reqs, cached)]
    shown = shown_count(items, REQUESTS_CHARS) if compact else len(items)
    out = Text()
    for i, (req, c) in enumerate(zip(event.reqs[:shown], cached)):
        if i:
            out.append(" ")
        out.append(f"{'' if compact else 'uid'}{req.uid}", style="bold" if req.uid in event.finished else "")
        if req.constrained:
            out.append(GRAMMAR_MARK, style="cyan")
        out.append(f":{req.extend_len}")
        if c:
            out.append(f"+{c}" if compact else f"(+{c})", style="magenta")
    if shown < len(items):
        out.append(f"{' ' if shown else ''}+{len(items) - shown}", style="dim")
    return out


def wait_cell(event: StepEvent, compact: bool = False) -> Text:
    """How many wait, and in two words why the first of them does: ``3 · no row``, ``1 · no KV`` (compact:
    ``3 row``, ``1 KV``)."""
    out = Text(str(event.waiting))
    if event.waits:
        kind = event.waits[0].kind
        words = SHORT_REASON.get(kind, kind) if compact else f"· {WAIT_WORDS.get(kind, kind)}"
        out.append(f" {words}", style="yellow")
    return out


def note_words(note: str, compact: bool) -> str:
    return next((short for start, short in SHORT_NOTES.items() if note.startswith(start)), note) if compact else note


def has_late_arrivals(events: Sequence[StepEvent]) -> bool:
    """Did any request arrive after the run's first step? Only then is the ``new`` column worth its room."""
    return any(e.arrived for e in events[1:])


def step_row(event: StepEvent, show_cached: bool, with_arrivals: bool = False,
             compact: bool = False) -> list[Text | str]:
    row: list[Text | str] = [str(event.step), Text(event.phase, style=PHASE_STYLE.get(event.phase, "")),
                             str(event.batch_size), str(event.num_tokens), requests_cell(event, show_cached, compact)]
    if with_arrivals:
        row.append(uid_list(event.arrived, compact, "blue"))
    return row + [f"{event.kv_pages_used}/{event.kv_pages_total}", wait_cell(event, compact),
                  uid_list(event.finished, compact, "dim"), f"{event.elapsed_s * 1000:.0f}",
                  Text(note_words(event.note, compact), style="yellow")]


def step_columns(events: Sequence[StepEvent], show_cached: bool, with_arrivals: bool | None = None,
                 compact: bool = False) -> list[str]:
    requests = "uid:len" if compact else "uid:extend_len" + (" (+cached)" if show_cached else "")
    names = ["step", "phase", "bs", "tok" if compact else "tokens", requests]
    if has_late_arrivals(events) if with_arrivals is None else with_arrivals:
        names.append("new")
    return names + ["KV" if compact else "KV pages", "wait", "done", "ms"]


class ByWidth:
    """A renderable built for the width it is given: full words from WIDE_COLUMNS on, else compact."""

    def __init__(self, build: Callable[[bool], RenderableType]) -> None:
        self.build = build

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.build(options.max_width < WIDE_COLUMNS)


class StepTable:
    """The step table for whatever width it is printed at (``fit_step_table``)."""

    def __init__(self, *args: object) -> None:
        self.args = args

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield fit_step_table(console, options, *self.args)  # type: ignore[arg-type]


def step_table(events: Sequence[StepEvent], show_cached: bool = False, caption: str | None = None,
               title: str = "scheduled batches", with_arrivals: bool | None = None) -> StepTable:
    return StepTable(events, show_cached, caption, title, with_arrivals)


def fit_step_table(console: Console, options: ConsoleOptions, events: Sequence[StepEvent], show_cached: bool,
                   caption: str | None, title: str = "scheduled batches",
                   with_arrivals: bool | None = None) -> Table:
    """The full words from WIDE_COLUMNS on; narrower, the compact cells, two spaces apart where they fit and one
    where they do not."""
    args = (events, show_cached, caption, title, with_arrivals)
    if options.max_width >= WIDE_COLUMNS:
        return build_step_table(*args)
    roomy = build_step_table(*args, compact=True)
    if Measurement.get(console, options.update_width(10 * WIDE_COLUMNS), roomy).maximum <= options.max_width:
        return roomy
    return build_step_table(*args, compact=True, tight=True)


def build_step_table(events: Sequence[StepEvent], show_cached: bool = False, caption: str | None = None,
                     title: str = "scheduled batches", with_arrivals: bool | None = None,
                     compact: bool = False, tight: bool = False) -> Table:
    table = titled_table(title, caption, padding=(0, 0)) if tight else titled_table(title, caption)
    arrivals = has_late_arrivals(events) if with_arrivals is None else with_arrivals
    # numbers keep every digit (no_wrap: a narrow screen squeezes the request lists instead); the compact form's
    # cells are cut to fit one line, so none of them wraps
    for name in step_columns(events, show_cached, arrivals, compact):
        if name.startswith("uid:") or name in ("new", "done"):
            narrow = 4 if name == "new" and not compact else None
            table.add_column(name, no_wrap=compact, overflow="fold", max_width=narrow)
        else:
            table.add_column(name, justify="left" if name == "phase" else "right", no_wrap=True)
    with_notes = any(e.note for e in events)
    if with_notes:
        table.add_column("note", no_wrap=compact, overflow="fold")
    for event in events:
        row = step_row(event, show_cached, arrivals, compact)
        table.add_row(*(row if with_notes else row[:-1]))
    return table


def legend_for(events: Sequence[StepEvent], show_cached: bool, with_arrivals: bool | None = None,
               compact: bool | None = None) -> RenderableType:
    """One line for each column the table shows (in its compact words, or as the width it is printed at asks)."""
    if compact is None:
        return ByWidth(lambda narrow: legend_for(events, show_cached, with_arrivals, narrow))
    names = {"uid:extend_len" if n.startswith("uid:ext") else n
             for n in step_columns(events, show_cached, with_arrivals, compact)}
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
        compact = options.max_width < WIDE_COLUMNS
        parts = [fit_step_table(console, options, shown, self.show_cached,
                                self.caption(len(self.events) - len(shown)), with_arrivals=arrivals)]
        if newest is not None:
            parts.append(step_detail(newest, self.show_radix, self.decode))
        if self.show_legend:
            parts.append(legend_for(self.events, self.show_cached, arrivals, compact))
        yield Group(*parts)
