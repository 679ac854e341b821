"""Generations: a compact table (for the trace), full continuations (for ``generate``), and a run summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich import box
from rich.console import RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from core.request import Result
from render.prompt_echo import PromptCell, echo_prompt
from render.style import FINISH_STYLE, one_line, show_edges, titled_table
from render.verify import verdict_mark

if TYPE_CHECKING:
    from core.bench.reference import Verdict



def finish_text(result: Result) -> Text:
    reason = result["finish_reason"] or "?"
    return Text(reason, style=FINISH_STYLE.get(reason, ""))


def generations_table(labels: Sequence[str], results: Sequence[Result],
                      verdicts: Sequence[Verdict] | None = None, title: str = "generations",
                      visible_whitespace: bool = False) -> Table:
    """``visible_whitespace`` shows trailing spaces as ␣, so a completion of one space is not a blank."""
    table = titled_table(title)
    table.add_column("uid", justify="right", no_wrap=True)
    table.add_column("prompt", max_width=32)
    table.add_column("completion", overflow="fold")
    table.add_column("finish", no_wrap=True)
    table.add_column("tokens", justify="right", no_wrap=True)
    if verdicts is not None:
        table.add_column("vs HF")
    for i, (label, result) in enumerate(zip(labels, results)):
        completion = (Text(result["error"] or "", style="red") if result["finish_reason"] == "error"
                      else one_line(show_edges(result["text"]) if visible_whitespace else result["text"],
                                    style="green"))
        row: list[RenderableType] = [str(result.get("uid", i)), PromptCell(label), completion, finish_text(result),
                                     str(len(result["token_ids"]))]
        if verdicts is not None:
            row.append(verdict_mark(verdicts[i]))
        table.add_row(*row)
    return table


def completion_header(index: int, total: int, result: Result) -> RenderableType:
    """A rule with the request's place, finish reason and token counts, above its prompt and continuation."""
    count = len(result["token_ids"])
    header = Text.assemble((f"{index + 1}/{total} ", "bold"), finish_text(result),
                           (f" · {result['prompt_tokens']:,} prompt tokens · {count:,} generated", "dim"))
    return Rule(header, align="left", style="dim")


def stream_header(index: int, total: int, prompt_tokens: int) -> RenderableType:
    """Above a streamed continuation: how it ends is not known yet (``stream_footer`` says it after)."""
    return Rule(Text.assemble((f"{index + 1}/{total} ", "bold"), (f"· {prompt_tokens:,} prompt tokens", "dim")),
                align="left", style="dim")


def stream_footer(result: Result) -> Text:
    return Text.assemble(finish_text(result), (f" · {len(result['token_ids']):,} generated", "dim"))


def completion_body(label: str, result: Result, separator: str = "") -> Text:
    """The prompt (cut when long) followed by its continuation exactly as generated (newlines kept), for a
    terminal. ``separator`` goes between them: nothing for a plain continuation, a newline for a chat reply."""
    body = Text(echo_prompt(label), style="bold")
    if result["finish_reason"] == "error":
        return Text.assemble(body, "\n", ("error: ", "bold red"), (result["error"] or "", "red"))
    body.append(separator + result["text"], style="green")
    return body


def completion_plain(label: str, result: Result, separator: str = "") -> str:
    """The same as ``completion_body`` as plain text, for a pipe or a file: the continuation byte for byte
    (Rich would expand tabs and drop control characters)."""
    if result["finish_reason"] == "error":
        return f"{echo_prompt(label)}\nerror: {result['error'] or ''}"
    return echo_prompt(label) + separator + result["text"]


@dataclass(frozen=True)
class RunSummary:
    requests: int
    prompt_tokens: int
    generated_tokens: int
    errors: int
    wall_s: float
    interrupted: int = 0

    @classmethod
    def of(cls, results: Sequence[Result], wall_s: float) -> "RunSummary":
        return cls(len(results), sum(r["prompt_tokens"] for r in results),
                   sum(len(r["token_ids"]) for r in results),
                   sum(r["finish_reason"] == "error" for r in results), wall_s,
                   sum(r["finish_reason"] == "interrupted" for r in results))

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
    if summary.interrupted:
        table.add_row(Text("interrupted", style="yellow"), Text(str(summary.interrupted), style="yellow"))
    table.add_row("prompt tokens", str(summary.prompt_tokens))
    table.add_row("generated tokens", str(summary.generated_tokens))
    table.add_row("wall time", f"{summary.wall_s:.2f} s")
    table.add_row("throughput", f"{summary.tokens_per_s:.1f} tok/s")
    return table
