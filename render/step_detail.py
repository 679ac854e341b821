"""Under the live table: why each queued request waits, the KV pool bar, the radix tree, and the legend.

All of it describes one step (the newest), in words a learner reads without the README.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from core.events import StepEvent
from render.kv_bar import kv_bar
from render.radix_tree import radix_tree

WAITS_SHOWN = 4

SHORT_REASON = {"rows": "row", "kv_pages": "KV", "token_budget": "budget", "forced_decode": "decode",
                "fcfs": "FCFS", "shared_prefix": "prefix", "preempted": "preempted", "grammar": "grammar"}
# the step table's wait column: why the first queued request waits, in two words
WAIT_WORDS = {"rows": "no row", "kv_pages": "no KV", "token_budget": "budget", "forced_decode": "decode",
              "fcfs": "FCFS", "shared_prefix": "prefix", "preempted": "preempted", "grammar": "grammar"}

LEGEND = (
    ("step", "the forward pass's number: one batch, one phase"),
    ("phase", "prefill: prompt tokens go in · decode: one new token per request"),
    ("bs", "batch size: requests in this step"),
    ("tokens", "tokens the model computed in this step"),
    ("tok", "tokens the model computed in this step"),
    ("uid:extend_len", "tokens computed (+N: from the prefix cache; § under a grammar)"),
    ("uid:len", "uid:tokens computed (+N: from the prefix cache; § under a grammar)"),
    ("new", "requests that arrived just before this step"),
    ("KV pages", "KV cache pages in use / pages in the pool"),
    ("KV", "KV cache pages in use / pages in the pool"),
    ("wait", "requests still queued · why the first waits: (no) row, (no) KV pages, budget, decode, FCFS, prefix, "
             "preempted, grammar (being compiled)"),
    ("done", "requests that finished in this step"),
    ("ms", "how long the step took"),
)

# the legend's lines: one a column the table shows (its full or its compact words, never both), and one that the
# wait column's line wraps to at 80 columns
LEGEND_LINES = 11


def wait_lines(event: StepEvent) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    for i, wait in enumerate(event.waits[:WAITS_SHOWN]):
        table.add_row("waiting" if i == 0 else "", f"uid{wait.uid}", Text(wait.text, style="yellow"))
    hidden = len(event.waits) - WAITS_SHOWN
    if hidden > 0:
        table.add_row("", "", Text(f"… and {hidden} more behind them", style="dim"))
    if not event.waits:
        table.add_row("waiting", Text("nobody: every request has been admitted", style="dim"), "")
    return table


def legend(columns: set[str]) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(style="bold dim", no_wrap=True)
    table.add_column(style="dim", overflow="fold")
    for name, meaning in LEGEND:
        if name in columns:
            table.add_row(name, meaning)
    return table


def step_detail(event: StepEvent, show_radix: bool = False,
                decode: Callable[[list[int]], str] | None = None) -> RenderableType:
    """The newest step's queue, its KV pool, and (when asked) the radix tree."""
    parts: list[RenderableType] = [wait_lines(event)]
    if event.kv is not None:
        parts.append(Text.assemble(("KV pages ", "bold"), kv_bar(event.kv, width=24)))
    if event.preempted:
        victims = " ".join(f"uid{uid}" for uid in event.preempted)
        parts.append(Text.assemble(("preempted ", "bold red"), f"{victims}: {event.preempted_pages} pages given back "
                                   "(what the prefix cache keeps stays cached), queued again at the head"))
    if show_radix and event.radix is not None:
        parts.append(radix_tree(event.radix, decode, event.evicted_pages))
    return Group(*parts)


def detail_height(event: StepEvent | None, show_radix: bool, with_legend: bool) -> int:
    """Lines the detail and legend take, so the live table leaves them room."""
    if event is None:
        return LEGEND_LINES if with_legend else 0
    lines = max(1, min(len(event.waits), WAITS_SHOWN + 1)) + 1 + bool(event.preempted)
    if show_radix and event.radix is not None:
        lines += 1 + max(1, len(event.radix))
    return lines + (LEGEND_LINES if with_legend else 0)
