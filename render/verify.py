"""How a comparison with transformers is shown: a mark per generation, and the full verify table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from core.words import plural
from render.prompt_echo import PromptCell
from render.style import one_line, titled_table

if TYPE_CHECKING:  # the reference itself (torch, transformers) is loaded only by the commands that run it
    from core.bench.reference import Verdict

_MARKS = {"match": ("✓ exact", "bold green"), "near-tie": ("≈ near-tie", "bold yellow"),
          "mismatch": ("✗ differs", "bold red"), "error": ("! error", "bold red")}


def verdict_mark(verdict: Verdict) -> Text:
    label, style = _MARKS[verdict.status]
    text = Text(label, style=style)
    if verdict.position is not None:
        text.append(f" at {verdict.position}", style="dim")
    return text


def verify_table(labels: Sequence[str], results: Sequence[dict[str, Any]], verdicts: Sequence[Verdict],
                 token_text: Callable[[int | None], str]) -> Table:
    """One row per prompt; where it differs, both tokens (as text and id) and the near-tie evidence."""
    table = titled_table("engine (batched) vs transformers (one prompt at a time, greedy, float32)")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("prompt", max_width=28)
    table.add_column("result", no_wrap=True)
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("first difference", overflow="fold", ratio=1)
    for i, (label, result, verdict) in enumerate(zip(labels, results, verdicts)):
        table.add_row(str(i), PromptCell(label), verdict_mark(verdict), str(len(result["token_ids"])),
                      difference(verdict, token_text))
    return table


def difference(verdict: Verdict, token_text: Callable[[int | None], str]) -> Text:
    """Both tokens at the first differing position and how close the reference found them."""
    if verdict.status == "error":
        return Text(verdict.error or "", style="red")
    if verdict.status == "match":
        return Text("")
    text = Text.assemble("engine ", (_token(verdict.engine_token, token_text), "bold"), ", reference ",
                         (_token(verdict.reference_token, token_text), "bold"))
    text.append(f"; {_detail(verdict)}", style="dim")
    return text


def _token(token: int | None, token_text: Callable[[int | None], str]) -> str:
    return f"{token_text(token)!r} ({'EOS' if token is None else token})"


def _detail(verdict: Verdict) -> str:
    if verdict.rank is None:
        return "not in the reference's top-5"
    return f"#{verdict.rank + 1} in the reference's top-5 (logprob {verdict.logprob_gap:.3f} below its choice)"


def summary_line(verdicts: Sequence[Verdict]) -> Text:
    exact = sum(v.exact for v in verdicts)
    style = "bold green" if exact == len(verdicts) else "bold red"
    text = Text(f"{exact}/{plural(len(verdicts), 'prompt')} {'matches' if len(verdicts) == 1 else 'match'} "
                "transformers token for token", style=style)
    ties = sum(v.status == "near-tie" for v in verdicts)
    if ties:
        text.append(f"; {ties} differ only at a near-tie", style="yellow")
    return text
