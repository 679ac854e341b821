"""What ``minisgl trace`` keeps of a run, and replaying it: the trace file, the HTML page, the Perfetto file.

The formats live in render/ (they are views of step events); this module only ties them to options: it checks
the output paths before a model loads, names the run in the trace's header, writes the exports at the end,
and replays a saved trace through the same screen a live run prints, without loading any model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console, RenderableType
from rich.live import Live

from core.words import plural
from minisgl_cli.engine_options import EngineOptions, flag
from minisgl_cli.options import SamplingOptions
from minisgl_cli.pacing import STEP_HINT, Pacer, StopRequested
from minisgl_cli.paths import check_output_file
from render.html_replay import save_html
from render.perfetto import save_perfetto
from render.results import generations_table
from render.step_detail import step_detail
from render.steps import LiveSteps, has_late_arrivals, legend_for, step_table
from render.timeline import timeline_table
from render.trace_format import Trace, TraceFormatError, TraceHeader, read_trace

Decode = Callable[[list[int]], str]

EMBEDDED_MODEL = "SmolLM2-135M-Instruct (embedded)"

Replay = Annotated[Optional[Path], typer.Option(
    "--replay", metavar="FILE.jsonl", rich_help_panel="Trace files",
    help="Replay a saved --trace-out file (no model is loaded): the same table, and --html/--perfetto/--svg.")]
Html = Annotated[Optional[Path], typer.Option(
    "--html", metavar="FILE.html", rich_help_panel="Trace files",
    help="Save a self-contained HTML page that replays the run step by step (opens offline in any browser).")]
Perfetto = Annotated[Optional[Path], typer.Option(
    "--perfetto", metavar="FILE.json", rich_help_panel="Trace files",
    help="Save the run as Chrome trace-event JSON: open it in ui.perfetto.dev or chrome://tracing.")]


@dataclass(frozen=True)
class Exports:
    """The files a run or a replay writes at its end."""

    html: Path | None = None
    perfetto: Path | None = None

    def check(self) -> None:
        """Before any model loads: a directory that does not exist fails now, not after the run."""
        for path, option in ((self.html, "--html"), (self.perfetto, "--perfetto")):
            check_output_file(path, option)

    def save(self, trace: Trace, err: Console, decode: Decode | None = None) -> None:
        """``decode``: the tokenizer, to show the radix tree's token spans as text (a replay has the file's)."""
        if decode is not None:
            trace = trace.with_token_text(decode)
        if self.html:
            _write(save_html, trace, self.html, "--html")
            err.print(f"[dim]saved {self.html} (open it in a browser)[/]")
        if self.perfetto:
            _write(save_perfetto, trace, self.perfetto, "--perfetto")
            err.print(f"[dim]saved {self.perfetto} (open it in ui.perfetto.dev or chrome://tracing)[/]")


def _write(save: Any, trace: Trace, path: Path, option: str) -> None:
    try:
        save(trace, path)
    except OSError as exc:
        raise typer.BadParameter(f"cannot write {path}: {exc.strerror or exc}", param_hint=f"'{option}'") from None


@dataclass(frozen=True)
class ReplayView:
    """The live table's options, as a replay takes them: the same as for a run."""

    show_radix: bool = False
    show_legend: bool = True
    step_delay: float = 0.0
    step_by_key: bool = False


def run_header(labels: list[str], engine: EngineOptions, sampling: SamplingOptions,
               arrival_every: int | None = None, arrival_rate: float | None = None) -> TraceHeader:
    """The trace's first line: which model, the options that shape the schedule, and each prompt's label."""
    # keyed as the command line names them (max_running, not max_running_req): the trace format's names
    options = {flag(key)[2:].replace("-", "_"): value for key, value in engine.values.items() if key != "model"}
    options.update(sampling.explicit())
    if arrival_every is not None:
        options["arrival_every"] = arrival_every
    if arrival_rate is not None:
        options["arrival_rate"] = arrival_rate
    return TraceHeader(engine.model or EMBEDDED_MODEL, options, tuple(labels))


def serve_header(engine: EngineOptions) -> TraceHeader:
    """A server's trace header: its requests arrive from clients, so it lists no prompts (render/trace_format.py
    labels them by uid when the file is read)."""
    header = run_header([], engine, SamplingOptions())
    return TraceHeader(header.model, {**header.options, "source": "serve"}, ())


def final_screen(trace: Trace, show_radix: bool = False, show_legend: bool = True, decode: Decode | None = None,
                 verdicts: Any = None) -> list[RenderableType]:
    """The screen a run ends on: every step, the last step's queue, KV pool (and tree), the legend, the
    generations (when it finished) and the timeline. A replay has no tokenizer: ``decode`` then reads the
    token text the trace file kept."""
    decode = decode or trace.decode
    show_cached = trace.header.show_cached
    screen: list[RenderableType] = [step_table(trace.events, show_cached)]
    if trace.events:
        screen.append(step_detail(trace.events[-1], show_radix, decode))
    if show_legend:
        screen.append(legend_for(trace.events, show_cached))
    if trace.results is not None:
        screen += [generations_table(trace.header.prompts, trace.results, verdicts, visible_whitespace=True),
                   timeline_table(trace.events, trace.header.prompts, [r["uid"] for r in trace.results])]
    else:
        screen.append(timeline_table(trace.events, trace.header.prompts))
    return screen


def load_replay(path: Path) -> Trace:
    try:
        return read_trace(path)
    except FileNotFoundError:
        raise typer.BadParameter(f"no such file: {path}", param_hint="'--replay'") from None
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror or exc}", param_hint="'--replay'") from None
    except UnicodeDecodeError:
        raise typer.BadParameter(f"{path} is not a text file", param_hint="'--replay'") from None
    except TraceFormatError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--replay'") from None


def replay(path: Path, options: ReplayView, exports: Exports, svg: Path | None, out: Console,
           err: Console) -> Trace:
    """Show a saved trace as the live run showed it, at the pace asked for: the step table grows (one row
    per key with ``--step``), then the final screen. ``q`` ends the replay early, with the steps shown so far."""
    exports.check()
    check_output_file(svg, "--svg")
    trace = load_replay(path)
    pacer = Pacer.for_terminal(options.step_delay, options.step_by_key, err)
    view = LiveSteps(show_cached=trace.header.show_cached, total_requests=len(trace.header.prompts),
                     show_legend=options.show_legend, show_radix=options.show_radix, decode=trace.decode,
                     arrivals_expected=has_late_arrivals(trace.events))
    view.hint = STEP_HINT if pacer.step_by_key else ""
    try:
        with Live(view, console=out, auto_refresh=False, transient=True) as live:
            live.refresh()
            for event in trace.events:
                if pacer.step_by_key:
                    pacer.before_step()
                view.add(event)
                live.refresh()
                pacer.after_step()
    except StopRequested:
        out.print(step_table(view.events, view.show_cached, caption=f"stopped with q after {plural(len(view.events), 'step')}"))
        raise typer.Exit(0) from None
    screen = final_screen(trace, options.show_radix, options.show_legend)
    for renderable in screen:
        out.print(renderable)
    if not trace.finished:
        err.print(f"[yellow]the run in {path} was interrupted after {plural(len(trace.events), 'step')}: no results[/]")
    if svg:
        from render.export import save_svg

        save_svg(screen, svg, title="minisgl trace")
        err.print(f"[dim]saved {svg}[/]")
    exports.save(trace, err)
    return trace
