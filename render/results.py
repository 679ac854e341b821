"""Generations: a compact table (for the trace), full continuations (for ``generate``), and a run summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from core.reference import Verdict
from render.style import FINISH_STYLE, one_line, show_edges, titled_table
from render.verify import verdict_mark

Result = dict[str, Any]


def finish_text(result: Result) -> Text:
    reason = result["finish_reason"] or "?"
    return Text(reason, style=FINISH_STYLE.get(reason, ""))


def generations_table(labels: Sequence[str], results: Sequence[Result],
                      verdicts: Sequence[Verdict] | None = None, title: str = "generations",
                      visible_whitespace: bool = False) -> Table:
    """``visible_whitespace`` shows trailing spaces as ␣, so a completion of one space is not a blank."""
    table = titled_table(title)
    table.add_column("uid", justify="right")
    table.add_column("prompt", max_width=32, no_wrap=True, overflow="ellipsis")
    table.add_column("completion", overflow="fold")
    table.add_column("finish")
    table.add_column("tokens", justify="right")
    if verdicts is not None:
        table.add_column("vs HF")
    for i, (label, result) in enumerate(zip(labels, results)):
        completion = (Text(result["error"] or "", style="red") if result["finish_reason"] == "error"
                      else one_line(show_edges(result["text"]) if visible_whitespace else result["text"],
                                    style="green"))
        row: list[RenderableType] = [str(i), one_line(label), completion, finish_text(result),
                                     str(len(result["token_ids"]))]
        if verdicts is not None:
            row.append(verdict_mark(verdicts[i]))
        table.add_row(*row)
    return table


def completion_block(index: int, total: int, label: str, result: Result, separator: str = "") -> RenderableType:
    """A prompt followed by its continuation exactly as generated (newlines kept), under a small header.
    ``separator`` goes between them: nothing for a plain continuation, a newline for a chat reply."""
    count = len(result["token_ids"])
    header = Text.assemble((f"{index + 1}/{total} ", "bold"), finish_text(result),
                           (f" · {result['prompt_tokens']} prompt tokens · {count} generated", "dim"))
    body = Text(label, style="bold")
    if result["finish_reason"] == "error":
        body = Text.assemble(body, "\n", ("error: ", "bold red"), (result["error"] or "", "red"))
    else:
        body.append(separator + result["text"], style="green")
    return Group(Rule(header, align="left", style="dim"), body)


@dataclass(frozen=True)
class RunSummary:
    requests: int
    prompt_tokens: int
    generated_tokens: int
    errors: int
    wall_s: float

    @classmethod
    def of(cls, results: Sequence[Result], wall_s: float) -> "RunSummary":
        return cls(len(results), sum(r["prompt_tokens"] for r in results),
                   sum(len(r["token_ids"]) for r in results),
                   sum(r["finish_reason"] == "error" for r in results), wall_s)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0


def summary_table(summary: RunSummary) -> Table:
    table = Table(title="summary", title_justify="left", show_header=False, box=box.SIMPLE, title_style="bold",
                  pad_edge=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("requests", str(summary.requests))
    if summary.errors:
        table.add_row(Text("errors", style="red"), Text(str(summary.errors), style="red"))
    table.add_row("prompt tokens", str(summary.prompt_tokens))
    table.add_row("generated tokens", str(summary.generated_tokens))
    table.add_row("wall time", f"{summary.wall_s:.2f} s")
    table.add_row("throughput", f"{summary.tokens_per_s:.1f} tok/s")
    return table
