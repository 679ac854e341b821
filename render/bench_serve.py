"""The table of ``minisgl bench --serve``: one row per rate beside the offline figure of the same requests."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from core.bench.report import Percentiles
from core.bench.serve_report import ServeReport, rate_name
from core.words import plural
from render.bench import busy_notes


def _pair(p: Percentiles, first: str = "p50") -> str:
    """Two figures of one measure in ms, 'a / b': p50 (or the mean) and p99."""
    return f"{_ms(getattr(p, first))}/{_ms(p.p99)}"


def _ms(seconds: float) -> str:
    """Tenths of a millisecond below 100 ms, whole ones above: a narrow terminal keeps every column."""
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def serve_view(report: ServeReport) -> Group:
    title = (f"{report.workload} workload: {plural(report.requests, 'request')}, "
             f"{plural(report.prompt_tokens, 'prompt token')}, "
             f"{report.output_tokens} output tokens per run, {report.model} at {report.url}")
    table = Table(title=title, title_justify="left", caption="rate in requests/s (inf: all at once); latencies in ms",
                  caption_justify="left")
    for column in ("rate", "tok/s", "x\noffline", "TTFT\np50/p99", "TPOT\nmean/p99", "ITL\np50/p99", "ok/\nfailed"):
        table.add_column(column, justify="left" if column == "rate" else "right")
    if report.offline is not None:
        busy = " [yellow]*[/yellow]" if report.offline.busy else ""
        table.add_row("offline", f"{report.offline.output_tokens_per_s:.1f}{busy}", "1.00x", "-", "-", "-",
                      f"{report.offline.requests}/0")
    for result in report.rates:
        ratio = report.of_offline(result)
        table.add_row(rate_name(result.rate), f"{result.output_tokens_per_s:.1f}",
                      "-" if ratio is None else f"{ratio:.2f}x", _pair(result.ttft), _pair(result.tpot, "mean"),
                      _pair(result.itl), f"{result.completed}/{result.failed}")
    parts: list = [table, *busy_notes([report.offline] if report.offline is not None else [])]
    if report.offline is not None:
        parts.append(f"[dim]offline: LLM.generate on the same requests in this process, "
                     f"{report.offline.wall_s:.2f} s[/dim]")
    parts += [f"[dim]rate {rate_name(r.rate)}: {r.failed} failed, the first with: {escape(r.first_error)}[/dim]"
              for r in report.rates if r.failed]
    if report.interrupted:
        parts.append("interrupted: the rates above are those measured before Ctrl-C")
    return Group(*parts)
