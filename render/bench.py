"""Rich views of a benchmark: a progress bar while it runs, and the side-by-side table when it is done."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Group
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from core.words import plural
from core.bench.names import STAGE_UNITS
from core.bench.report import BenchReport, Percentiles, RunResult
from render.activity import Activity

if TYPE_CHECKING:  # the floor's module imports torch; a view is built without it
    from core.bench.floor import Floor


class BenchProgress:
    """One bar per stage (the engine, then each baseline), fed by the benchmark's progress callback, each
    counting in its own units; the benchmark's phase notes print above the bars.

    Without a terminal there are no bars: a line when each stage starts and one when it ends."""

    def __init__(self, activity: Activity, units: dict[str, str] | None = None) -> None:
        self.activity = activity
        self.units = {**STAGE_UNITS, **(units or {})}  # a stage's unit; other commands name their own stages
        self.progress = Progress(TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), console=activity.console,
                                 transient=True, disable=not activity.live)
        self.tasks: dict[str, int] = {}
        self._started: dict[str, float] = {}

    def __enter__(self) -> "BenchProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def note(self, message: str) -> None:
        self.activity.note(message)

    def __call__(self, stage: str, done: int, total: int) -> None:
        unit = self.units.get(stage, "")
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=total, unit=unit)
            self._started[stage] = time.perf_counter()
            if not self.activity.live:
                self.activity.line(f"{stage}: {total} {unit}…")
        self.progress.update(self.tasks[stage], completed=done, total=total)
        if done >= total and not self.activity.live and stage in self._started:
            took = time.perf_counter() - self._started.pop(stage)
            self.activity.line(f"{stage}: {done}/{total} {unit} in {took:.1f} s")


def _ms(p: Percentiles) -> tuple[str, str, str]:
    return f"{p.mean * 1e3:.1f}", f"{p.p50 * 1e3:.1f}", f"{p.p99 * 1e3:.1f}"


def results_table(results: list[RunResult], title: str, floor: Floor | None = None, requests: int = 0) -> Table:
    """One row per run: its requests, wall time, tokens and tokens/s, beside the floor's tokens/s and the share of
    it the run reached (for a run of the whole workload of ``requests``, the floor's), and how many times faster
    minisgl was."""
    engine = next((r for r in results if r.name == "minisgl"), None)
    table = Table(title=title, title_justify="left")
    table.add_column("engine")
    table.add_column("requests", justify="right")
    table.add_column("wall s", justify="right")
    table.add_column("output tokens", justify="right")
    table.add_column("tokens/s", justify="right")
    if floor is not None:
        table.add_column("floor tokens/s", justify="right")
    table.add_column("minisgl is", justify="right")
    for result in results:
        ratio = engine.output_tokens_per_s / result.output_tokens_per_s if engine and result.output_tokens_per_s else 0
        cells = [result.name, str(result.requests), f"{result.wall_s:.2f}", str(result.output_tokens),
                 f"{result.output_tokens_per_s:.1f}" + (" [yellow]*[/yellow]" if result.busy else "")]
        if floor is not None:
            whole = result.requests == requests and floor.seconds > 0 and result.wall_s > 0
            cells.append(f"{result.output_tokens / floor.seconds:.1f} ({floor.seconds / result.wall_s:.0%})"
                         if whole else "-")
        table.add_row(*cells, "-" if result is engine or not engine else f"{ratio:.2f}x")
    return table


def busy_notes(results: list[RunResult]) -> list[str]:
    """A line under the table for each run the machine was busy during (marked * in it)."""
    return [f"[yellow]*[/yellow] {escape(r.name)}: the machine was busy ({r.others.words()} on average during "
            f"the run); not a quiet machine's figure" for r in results if r.busy and r.others is not None]


def interrupted_view(results: list[RunResult]) -> Group | str:
    """What a bench stopped with Ctrl-C had measured: the runs that finished."""
    if not results:
        return "interrupted before any run was measured"
    table = results_table(results, f"interrupted: the {plural(len(results), 'run')} measured before Ctrl-C")
    return Group(table, *busy_notes(results))


def bench_view(report: BenchReport) -> Group:
    engine = report.result("minisgl")
    title = (f"{report.workload} workload: {plural(report.requests, 'request')}, "
             f"{plural(report.prompt_tokens, 'prompt token')}, {report.model} on {report.device}, "
             f"KV cache in pages of {plural(report.page_size, 'token')}")
    parts: list = [results_table(report.results, title, report.floor, report.requests), *busy_notes(report.results)]
    parts += [f"[dim]{name} left out: {escape(why)}[/dim]" for name, why in report.skipped.items()]
    if engine is not None and engine.preemptions:
        parts.append(f"minisgl preempted {plural(engine.preemptions, 'request')} when the KV pool ran out "
                     "(each recomputed later from its prompt and the tokens it had)")
    if report.latency is not None:
        latency = Table(title="minisgl latency (ms)", title_justify="left")
        for column in ("", "mean", "p50", "p99"):
            latency.add_column(column, justify="right" if column else "left")
        latency.add_row("time to first token", *_ms(report.latency.ttft))
        latency.add_row("time per output token", *_ms(report.latency.tpot))
        parts.append(latency)
    if report.batch1_ms_per_token is not None:
        floor = (f"; floor {report.batch1_floor_ms:.3f} ms, weights and KV read once: "
                 f"{report.batch1_floor_fraction:.0%} of its speed" if report.batch1_floor_fraction else "")
        parts.append(f"batch-1 decode: {report.batch1_ms_per_token:.2f} ms per token (median, one request alone"
                     f"{floor})")
    if report.precision_note:
        parts.append(f"[dim]{escape(report.precision_note)}[/dim]")
    exact = report.result("minisgl exact")
    if exact is not None and engine is not None and exact.output_tokens_per_s:
        line = (f"precision {report.precision} against exact in this run: "
                f"{engine.output_tokens_per_s / exact.output_tokens_per_s:.2f}x the tokens/s")
        if report.exact_batch1_ms_per_token and report.batch1_ms_per_token:
            line += (f", batch-1 {report.batch1_ms_per_token:.2f} against {report.exact_batch1_ms_per_token:.2f} ms "
                     f"per token ({report.exact_batch1_ms_per_token / report.batch1_ms_per_token:.2f}x)")
        parts.append(line)
    if report.matmul_gflops > 0:
        parts.append(f"matmul ceiling {report.matmul_gflops:.1f} GFLOP/s; minisgl did {report.model_gflop:.1f} GFLOP "
                     f"of model work at {report.engine_gflops:.1f} GFLOP/s = "
                     f"{report.model_flops_fraction:.0%} of the ceiling")
    if report.floor is not None and engine is not None:
        f = report.floor
        bandwidth = max(report.copy_gbps, report.read_gbps)  # Ceilings.stream_gbps: what the floors read at
        parts.append(f"floor {f.seconds:.2f} s on {bandwidth:.0f} GB/s and {report.matmul_gflops:.0f} GFLOP/s "
                     f"(prefill {f.prefill_s:.2f} s; {f.decode_steps} decode steps {f.decode_s:.2f} s: KV "
                     f"{f.kv_read_bytes / 1e9:.1f} GB, weights {f.weight_read_bytes / 1e9:.1f} GB); minisgl "
                     f"{engine.wall_s:.2f} s = [bold]{report.floor_fraction:.0%} of the floor[/bold]")
    return Group(*parts)
