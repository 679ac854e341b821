"""``minisgl trace``: watch the scheduler build each batch, live, then see who ran when.

The step table grows by one row per scheduled batch while the engine runs (a Rich Live display fed by the
engine's step events). When every request is done, the full table, the generations and a per-request timeline
are printed; that final screen is what ``--svg`` saves. Ctrl-C stops cleanly: the live display is closed, the
steps so far are printed, and the ``--trace-out`` file holds every finished step as a complete JSON line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console, RenderableType
from rich.live import Live

import sample_prompts
from core import LLM
from core.events import StepEvent
from core.prompts import Prompt
from minisgl_cli import options as o
from minisgl_cli.jobs import (Job, Result, check_against_reference, engine_inputs, load_job, load_llm,
                                 require_greedy)
from minisgl_cli import trace_exports as x
from minisgl_cli.trace_file import TraceFile
from render.export import save_svg
from render.steps import LiveSteps, step_table
from render.trace_format import Trace
from render.verify import summary_line

INTERRUPTED = 130
MISMATCH = 1

TraceOut = Annotated[Optional[Path], typer.Option(
    "--trace-out", metavar="FILE.jsonl", help="Write every step event as a JSON line (flushed as it happens).")]
Svg = Annotated[Optional[Path], typer.Option("--svg", metavar="FILE.svg", help="Save the final screen as SVG.")]
Verify = Annotated[bool, typer.Option("--verify", help="Check each generation against transformers greedy.")]


def trace(prompts: o.OptionalPrompts = None, trace_out: TraceOut = None, svg: Svg = None, verify: Verify = False,
          max_tokens: o.MaxTokens = None, temperature: o.Temperature = None, top_k: o.TopK = None,
          top_p: o.TopP = None, seed: o.Seed = None, ignore_eos: o.IgnoreEos = None, model: o.Model = None,
          cache: o.Cache = o.DEFAULT_CACHE, page_size: o.PageSize = o.DEFAULT_PAGE_SIZE,
          max_running: o.MaxRunning = o.DEFAULT_MAX_RUNNING, num_pages: o.NumPages = None,
          chat: o.Chat = False, attention: o.Attention = None, cuda_graph_max_bs: o.CudaGraphMaxBs = None,
          tp: o.Tp = 1, dtype: o.Dtype = None, replay: x.Replay = None, html: x.Html = None,
          perfetto: x.Perfetto = None) -> None:
    """Watch the scheduler: one live row per batch, then the generations and a per-request timeline.

    Each row shows the phase, batch size, tokens, every request's extend length and the KV pages in use.
    Without PROMPTS it runs the tutorial's five prompts (max_tokens 6, 2, 5, 1, 4, EOS ignored)."""
    out, err = Console(), Console(stderr=True)
    exports = x.Exports(html, perfetto)
    if replay:
        if prompts is not None:
            raise typer.BadParameter("a replay takes no PROMPTS: the trace file holds the run", param_hint="'--replay'")
        x.replay(replay, exports, svg, out, err)
        return
    sampling = o.SamplingOptions(max_tokens, temperature, top_k, top_p, seed, ignore_eos)
    engine = o.EngineOptions(model, cache, page_size, max_running, num_pages, chat, attention, cuda_graph_max_bs,
                             tp, dtype)
    job = load_job(prompts or sample_prompts.path(), sampling)
    if verify:
        require_greedy(job)
    x.check_writable(svg, "--svg")
    exports.check()
    header = x.run_header(job.labels, engine, sampling)
    trace_file = TraceFile(trace_out, header) if trace_out else None
    try:
        llm = load_llm(engine, err)
        inputs = engine_inputs(llm, job, chat)
        view = LiveSteps(show_cached=cache != "naive", total_requests=len(inputs))
        try:
            results = _run_live(llm, inputs, job, view, trace_file, out)
        except KeyboardInterrupt:
            _report_interrupt(view, trace_file, out, err)
            exports.save(Trace(header, view.events), err)
            raise typer.Exit(INTERRUPTED) from None
        if trace_file:
            trace_file.write_results(results)
    finally:
        if trace_file:
            trace_file.close()
    verdicts = check_against_reference(llm, inputs, job, results, err) if verify else None
    run = Trace(header, view.events, results)
    screen: list[RenderableType] = x.final_screen(run, verdicts)
    if verdicts is not None:
        screen.append(summary_line(verdicts))
    for renderable in screen:
        out.print(renderable)
    if svg:
        save_svg(screen, svg, title="minisgl trace")
        err.print(f"[dim]saved {svg}[/]")
    if trace_file:
        err.print(f"[dim]wrote {trace_file.lines} step events to {trace_file.path}[/]")
    exports.save(run, err)
    if verdicts is not None and not all(v.exact for v in verdicts):
        raise typer.Exit(MISMATCH)


def _run_live(llm: LLM, inputs: list[Prompt], job: Job, view: LiveSteps, trace_file: TraceFile | None,
              out: Console) -> list[Result]:
    """Generate with the step table on screen, redrawn on every step event: the engine runs on this thread,
    so there is nothing to redraw between steps."""
    with Live(view, console=out, auto_refresh=False, transient=True) as live:
        def on_step(event: StepEvent) -> None:
            if trace_file:
                trace_file.write(event)
            view.add(event)
            live.refresh()

        llm.add_step_callback(on_step)
        live.refresh()
        return llm.generate(inputs, job.params)


def _report_interrupt(view: LiveSteps, trace_file: TraceFile | None, out: Console, err: Console) -> None:
    if view.events:
        out.print(step_table(view.events, view.show_cached, caption=f"interrupted after {len(view.events)} steps"))
    where = f"; {trace_file.lines} complete step events are in {trace_file.path}" if trace_file else ""
    err.print(f"interrupted{where}")

