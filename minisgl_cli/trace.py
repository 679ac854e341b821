"""``minisgl trace``: watch the scheduler build each batch, live, then see who ran when.

The step table grows by one row per scheduled batch while the engine runs (a Rich Live display fed by the
engine's step events); under it, the newest step's queue with why each request waits, the KV pool bar, the radix
tree (``--show-radix``) and a legend. Requests can arrive while it runs (``arrival_step``/``arrival_s`` in a
JSONL file, ``--arrival-every``, ``--arrival-rate``), and ``--step-delay``/``--step`` set the pace. When every
request is done, the full table, the generations and a per-request timeline are printed; that final screen is
what ``--svg`` saves. Ctrl-C stops cleanly: the live display is closed, the steps so far are printed, and the
``--trace-out`` file holds every finished step as a complete JSON line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console, RenderableType
from rich.live import Live

import sample_prompts
from core.errors import InvalidParamsError
from core.words import plural
from core.events import StepEvent
from core.llm.arrivals import Arrival, every_n_steps, poisson
from minisgl_cli.prompts import Prompt
from minisgl_cli.console import stderr_console, stdout_console
from minisgl_cli import options as o
from minisgl_cli.engine_options import EngineOptions, with_engine_options
from minisgl_cli.exits import INTERRUPTED, SOME_FAILED
from minisgl_cli.jobs import (Job, Result, check_against_reference, check_context, engine_inputs, exit_for,
                              load_job, load_llm, require_greedy, with_model_defaults)
from minisgl_cli.pacing import STEP_HINT, Pacer, StopRequested
from minisgl_cli import trace_exports as x
from minisgl_cli.paths import check_output_file
from minisgl_cli.trace_file import TraceFile
from render.export import save_svg
from render.steps import LiveSteps, step_table
from render.activity import Activity
from render.trace_format import Trace
from render.verify import summary_line

if TYPE_CHECKING:
    from core.llm import LLM

TraceOut = Annotated[Optional[Path], typer.Option(
    "--trace-out", metavar="FILE.jsonl", help="Write every step event as a JSON line (flushed as it happens).")]
Svg = Annotated[Optional[Path], typer.Option("--svg", metavar="FILE.svg", help="Save the final screen as SVG.")]
Verify = Annotated[bool, typer.Option("--verify", metavar=o.FLAG,
                                     help="Check each generation against transformers greedy.")]
_ARRIVALS = "Arrivals and pace"
ArrivalEvery = Annotated[Optional[int], typer.Option(
    "--arrival-every", min=1, metavar="N", rich_help_panel=_ARRIVALS,
    help="One new request every N steps (request i arrives before step i*N) instead of all at the start.")]


def _positive_rate(value: Optional[float]) -> Optional[float]:
    """A rate of 0 would never send a request: R must be above 0 (which the help says, as Click's ranges
    cannot)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"{value:g} is not a rate of requests per second; give R > 0")
    return value


ArrivalRate = Annotated[Optional[float], typer.Option(
    "--arrival-rate", metavar="R", callback=_positive_rate, rich_help_panel=_ARRIVALS,
    help="Poisson arrivals, R > 0 requests per second on average (seeded by --seed, else 0).")]
StepDelay = Annotated[float, typer.Option(
    "--step-delay", min=0.0, metavar="SECONDS", rich_help_panel=_ARRIVALS,
    help="Pause after every step so the table can be read as it grows (terminal only).")]
StepByKey = Annotated[bool, typer.Option(
    "--step", metavar=o.FLAG, rich_help_panel=_ARRIVALS,
    help="Wait for Enter or space before each step; q stops the run (terminal only).")]
ShowRadix = Annotated[bool, typer.Option(
    "--show-radix", metavar=o.FLAG, rich_help_panel=_ARRIVALS,
    help="Draw the radix cache's tree (token spans, locks, who holds what) under the table (needs --cache radix).")]
Web = Annotated[bool, typer.Option(
    "--web", metavar=o.FLAG, rich_help_panel=_ARRIVALS,
    help="Also show the run in the browser (the URL is printed); it keeps serving after the run until Ctrl-C.")]
WebPort = Annotated[int, typer.Option("--web-port", min=0, max=65535, rich_help_panel=_ARRIVALS,
                                      help="Port for --web (0: any free one).")]
NoLegend = Annotated[bool, typer.Option("--no-legend", metavar=o.FLAG, rich_help_panel=_ARRIVALS,
                                        help="Hide the line per column under the table.")]


@with_engine_options
def trace(prompts: o.OptionalPrompts = None, trace_out: TraceOut = None, svg: Svg = None, verify: Verify = False,
          max_tokens: o.MaxTokens = None, temperature: o.Temperature = None, top_k: o.TopK = None,
          top_p: o.TopP = None, seed: o.Seed = None, ignore_eos: o.IgnoreEos = None, chat: o.Chat = False,
          verbose: o.Verbose = False, arrival_every: ArrivalEvery = None,
          arrival_rate: ArrivalRate = None, step_delay: StepDelay = 0.0, step: StepByKey = False,
          show_radix: ShowRadix = False, no_legend: NoLegend = False, replay: x.Replay = None, html: x.Html = None,
          perfetto: x.Perfetto = None, web: Web = False, web_port: WebPort = 0, engine: EngineOptions = EngineOptions.defaults()) -> None:
    """Watch the scheduler: one live row per batch, then the generations and a per-request timeline.

    Each row shows the phase, batch size, tokens, every request's extend length, the KV pages in use and who
    waits; under the table, why each queued request waits and the KV pool. Without PROMPTS it runs the
    tutorial's five prompts (max_tokens 6, 2, 5, 1, 4, EOS ignored)."""
    out, err = stdout_console(), stderr_console()
    exports = x.Exports(html, perfetto)
    server = _web_server(web_port, err) if web else None
    view_options = x.ReplayView(show_radix, not no_legend, step_delay, step)
    if replay:
        if prompts is not None:
            raise typer.BadParameter("a replay takes no PROMPTS: the trace file holds the run", param_hint="'--replay'")
        _replay(replay, view_options, exports, svg, server, out, err)
        return
    if show_radix and engine.cache != "radix":
        raise InvalidParamsError(f"--show-radix: the radix tree needs --cache radix (--cache {engine.cache} keeps "
                                 f"no tree)")
    sampling = o.SamplingOptions(max_tokens, temperature, top_k, top_p, seed, ignore_eos)
    job = load_job(prompts or sample_prompts.path(), sampling)
    if verify:
        require_greedy(job, sampling)
    check_context(job, engine, sampling)
    if arrival_every is not None and arrival_rate is not None:
        raise typer.BadParameter("give one of --arrival-every and --arrival-rate", param_hint="'--arrival-rate'")
    arrivals = _arrivals(job, arrival_every, arrival_rate, seed)
    check_output_file(svg, "--svg")
    check_output_file(trace_out, "--trace-out")
    exports.check()
    pacer = Pacer.for_terminal(step_delay, step, err)
    header = x.run_header(job.labels, engine, sampling, arrival_every, arrival_rate)
    trace_file = TraceFile(trace_out, header) if trace_out else None
    try:
        llm = load_llm(engine, Activity(err), verbose)
        if not verify:  # verification compares greedy decoding: the model's sampling defaults stay out of it
            job = with_model_defaults(job, llm, sampling)
        if trace_file:
            trace_file.decode = llm.tokenizer.decode
        llm.report_radix = show_radix
        page = _web_run(llm, job, header, show_radix, server) if server is not None else None
        inputs = engine_inputs(llm, job, chat)
        view = LiveSteps(show_cached=engine.cache != "naive", total_requests=len(inputs), show_legend=not no_legend,
                         show_radix=show_radix, decode=llm.tokenizer.decode,
                         arrivals_expected=any(a is not None and (a.step or a.after_s) for a in arrivals or []))
        view.hint = STEP_HINT if pacer.step_by_key else ""
        try:
            results = _run_live(llm, inputs, job, arrivals, view, trace_file, pacer, out, page)
        except KeyboardInterrupt:
            _report_interrupt(view, trace_file, out, err)
            exports.save(Trace(header, view.events), err)
            raise typer.Exit(INTERRUPTED) from None
        except StopRequested:
            _report_interrupt(view, trace_file, out, err, how="stopped with q")
            exports.save(Trace(header, view.events), err)
            raise typer.Exit(0) from None
        if trace_file:
            trace_file.write_results(results)
    finally:
        if trace_file:
            trace_file.close()
    verdicts = check_against_reference(llm, inputs, job, results, Activity(err)) if verify else None
    run = Trace(header, view.events, results)
    _show_run(run, verdicts, view_options, llm.tokenizer.decode, svg, out, err)
    if trace_file:
        err.print(f"[dim]wrote {trace_file.lines} step events to {trace_file.path}[/]")
    exports.save(run, err, llm.tokenizer.decode)
    if page is not None:
        page.results(results)
        server.serve_until_interrupted(err)
    if verdicts is not None and not all(v.exact for v in verdicts):
        raise typer.Exit(SOME_FAILED)
    exit_for(results, Activity(err))


def _replay(path: Path, view: x.ReplayView, exports: x.Exports, svg: Optional[Path], server: Any, out: Console,
            err: Console) -> None:
    """``--replay``: the saved run step by step, and with ``--web`` its replay page until Ctrl-C."""
    if server is not None:
        from minisgl_cli.trace_web import replay_app

        server.start(replay_app(x.load_replay(path)))
    x.replay(path, view, exports, svg, out, err)
    if server is not None:
        server.serve_until_interrupted(err)


def _show_run(run: Trace, verdicts: Optional[list], view: x.ReplayView, decode: Any, svg: Optional[Path],
              out: Console, err: Console) -> None:
    """The final screen (generations, timeline, and the verdicts under --verify), also as an SVG with --svg."""
    screen: list[RenderableType] = x.final_screen(run, view.show_radix, view.show_legend, decode, verdicts)
    if verdicts is not None:
        screen.append(summary_line(verdicts))
    for renderable in screen:
        out.print(renderable)
    if svg:
        save_svg(screen, svg, title="minisgl trace")
        err.print(f"[dim]saved {svg}[/]")


def _web_server(port: int, err: Console):
    """The --web server's socket, bound before the model loads; its URL goes to stderr (no browser is opened)."""
    from minisgl_cli.trace_web import WebServer

    server = WebServer("127.0.0.1", port)
    err.print(f"watch it at {server.url}", highlight=False)
    return server


def _web_run(llm: LLM, job: Job, header, show_radix: bool, server):
    """The live page fed by this run's step events; it asks for the radix tree while a viewer shows it."""
    from minisgl_cli.trace_web import LiveRun

    def report_radix(on: bool) -> None:
        llm.report_radix = on or show_radix

    page = LiveRun(list(job.labels), header.model, header.options, report_radix)
    server.start(page.app)
    return page


def _arrivals(job: Job, every: int | None, rate: float | None, seed: int | None) -> list[Arrival | None] | None:
    """The options win over the file's own ``arrival_step``/``arrival_s``; None: everything at the start."""
    if every is not None:
        return list(every_n_steps(len(job.specs), every))
    if rate is not None:
        return list(poisson(len(job.specs), rate, seed if seed is not None else 0))
    from_file = [spec.arrival for spec in job.specs]
    return from_file if any(a is not None for a in from_file) else None


def _run_live(llm: LLM, inputs: list[Prompt], job: Job, arrivals: list[Arrival | None] | None, view: LiveSteps,
              trace_file: TraceFile | None, pacer: Pacer, out: Console, page=None) -> list[Result]:
    """Generate with the step table on screen, redrawn on every step event: the engine runs on this thread,
    so there is nothing to redraw between steps (and a pause between steps holds the engine too)."""
    with Live(view, console=out, auto_refresh=False, transient=True) as live:
        def on_step(event: StepEvent) -> None:
            if trace_file:
                trace_file.write(event)
            if page is not None:
                page.add(event)
            view.add(event)
            live.refresh()
            pacer.after_step()

        llm.add_step_callback(on_step)
        if pacer.step_by_key:
            llm.add_before_step_callback(lambda _step: pacer.before_step())
        live.refresh()
        return llm.generate(inputs, job.params, arrivals=arrivals)


def _report_interrupt(view: LiveSteps, trace_file: TraceFile | None, out: Console, err: Console,
                      how: str = "interrupted") -> None:
    if view.events:
        out.print(step_table(view.events, view.show_cached, caption=f"{how} after {plural(len(view.events), 'step')}"))
    where = f"; {trace_file.lines} complete step events are in {trace_file.path}" if trace_file else ""
    err.print(f"{how}; unfinished requests were aborted{where}")

