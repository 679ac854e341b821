"""What the commands have in common: read the prompts, load the engine, run it, check against transformers.

The order matters for the user: everything that can be checked without a model (the prompts file, option
combinations, output paths) is checked first, so a typo fails in milliseconds rather than after a load. For
the same reason this module imports no torch, transformers or engine at its top: they are imported inside
``load_llm`` and ``check_against_reference``, under a spinner that is already turning.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from core.errors import InvalidParamsError
from core.words import ENGINE_READY, plural
from minisgl_cli.prompts import Prompt, PromptSpec, chat_input_ids, read_prompts
from core.request import Result, SamplingParams
from minisgl_cli.exits import INTERRUPTED, SOME_FAILED
from minisgl_cli.engine_options import EngineOptions, flag
from minisgl_cli.options import SamplingOptions
from minisgl_cli.prompt_run import Collected, PromptRun
from render.activity import Activity
from render.progress import GenerationProgress

if TYPE_CHECKING:
    from core.llm import LLM
    from minisgl_cli.output import StreamPrinter
    from core.bench.reference import Verdict



@dataclass(frozen=True)
class Job:
    """The prompts of one command with the sampling parameters each will run with."""

    specs: list[PromptSpec]
    params: list[SamplingParams]

    @property
    def labels(self) -> list[str]:
        """How each prompt is shown: its text, or its token ids."""
        return [p.prompt if isinstance(p.prompt, str) else str(p.prompt) for p in self.specs]


def load_job(source: Path | str, sampling: SamplingOptions) -> Job:
    if str(source) == "-" and sys.stdin.isatty():  # else a terminal would just sit there, blank
        typer.echo("reading prompts from stdin, one a line (or JSON lines); end with Ctrl-D", err=True)
    specs = read_prompts(source, stdin=sys.stdin)
    explicit = sampling.explicit()
    try:
        SamplingParams(**explicit)  # a bad option is the command line's fault, not the file's
    except InvalidParamsError as exc:
        raise InvalidParamsError(f"bad sampling option: {exc}") from None
    # every field is validated on its own, so file values (checked when read) and options combine safely
    return Job(specs, [spec.params(explicit) for spec in specs])


def with_model_defaults(job: Job, llm: LLM, sampling: SamplingOptions) -> Job:
    """The prompts' parameters over the model's sampling defaults (its generation config, ``--generation-config``
    and ``--override-generation-config``): a value typed on the command line or set in the file wins."""
    defaults = llm.sampling_defaults.values
    if not defaults:
        return job
    explicit = sampling.explicit()
    try:
        return Job(job.specs, [SamplingParams(**{**defaults, **spec.overrides, **explicit}) for spec in job.specs])
    except InvalidParamsError as exc:
        raise InvalidParamsError(f"the model's sampling defaults ({llm.sampling_defaults.describe()}) and the "
                                 f"prompts' values do not agree: {exc}") from None


def require_greedy(job: Job, sampling: SamplingOptions) -> None:
    """Verification compares greedy decoding; sampled outputs have no single right answer. A temperature typed on
    the command line is named as the option, one from the prompts file by its line."""
    if sampling.temperature is not None and sampling.temperature != 0:
        raise InvalidParamsError(f"verify compares greedy decoding, but --temperature {sampling.temperature:g} "
                                 f"samples; leave it out or set --temperature 0")
    for spec, params in zip(job.specs, job.params):
        if not params.greedy:
            raise InvalidParamsError(f"verify compares greedy decoding, but the prompt on {spec.where} would be "
                                     f"sampled (temperature={params.temperature}); set --temperature 0")
        if params.controls_logits or params.stop_token_ids or params.constraint is not None:
            raise InvalidParamsError(f"verify compares plain greedy decoding, but the prompt on {spec.where} sets a "
                                     f"penalty, logit_bias, min_tokens, stop_token_ids or a json_schema or regex; "
                                     f"leave them out")


def check_context(job: Job, engine: EngineOptions, sampling: SamplingOptions) -> None:
    """A max_tokens that leaves no room for even a one-token prompt in the model's context can never run: a
    usage error before the model loads, wherever the context can be read cheaply (--max-seq-len, the model's
    config.json or GGUF header); otherwise the engine refuses each such prompt as it comes."""
    from core.models.weights import context_length  # no torch: it reads a few bytes of the model's files

    limits = [(context, f"the model's context of {plural(context, 'token')}")
              for context in [context_length(engine.model)]
              if context is not None]
    if engine.values["max_seq_len"] is not None:
        limits.append((engine.values["max_seq_len"], f"{flag('max_seq_len')} {engine.values['max_seq_len']}"))
    if not limits:
        return
    limit, what = min(limits)
    for spec, params in zip(job.specs, job.params):
        if params.max_tokens >= limit:
            given = (f"--max-tokens {params.max_tokens}" if sampling.max_tokens is not None
                     else f"max_tokens {params.max_tokens} on {spec.where}")
            raise InvalidParamsError(f"{given} cannot fit in {what} (prompt and output together); ask for at most "
                                     f"{limit - 1}")


def quiet_transformers() -> None:
    """transformers' own progress bars and notices would interleave with ours; its errors still show."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_llm(opts: EngineOptions, activity: Activity, verbose: bool = False) -> LLM:
    """Build the engine under a spinner that turns from the first moment (importing torch is part of the
    wait); the slow first conversion of a GGUF and the engine's summary are printed as notes."""
    opts.check()  # what the engine would refuse only after loading the model, said in the options typed
    name = opts.model or "the embedded SmolLM2-135M-Instruct"
    with interrupted_load(activity), activity.phase(f"loading {name}", closing=ENGINE_READY):
        from core.llm import LLM

        quiet_transformers()
        llm = LLM(opts.model, log=activity.note, **opts.given())
        if verbose:
            activity.note(llm.engine.describe())
        return llm


@contextmanager
def interrupted_load(activity: Activity) -> Iterator[None]:
    """Ctrl-C while the model loads: one line that says so and exit code 130 (not a silent exit)."""
    try:
        yield
    except KeyboardInterrupt:
        activity.line("interrupted while loading the model (exit code 130)")
        raise typer.Exit(INTERRUPTED) from None


def engine_inputs(llm: LLM, job: Job, chat: bool) -> list[Prompt]:
    """What goes to ``generate``: text as is, or the chat template's token ids; token-id prompts pass through."""
    if not chat:
        return [spec.prompt for spec in job.specs]
    return [chat_input_ids(llm.tokenizer, s.prompt) if isinstance(s.prompt, str) else s.prompt for s in job.specs]


def run_prompts(llm: LLM, inputs: list[Prompt], job: Job, activity: Activity,
                stream: Callable[[PromptRun], StreamPrinter] | None = None) -> tuple[list[Result], bool]:
    """Every prompt through the engine; the results, and whether Ctrl-C stopped the run (the results then
    hold the finished ones and 'interrupted' for the rest). With ``stream`` the text itself shows progress;
    otherwise a bar counts tokens and requests."""
    run = PromptRun(llm, inputs, job.params)
    if stream is not None:
        printer = stream(run)
        printer.start()
        results = run.run()
        printer.finish(results)
        return results, run.interrupted
    with GenerationProgress(activity, [p.max_tokens for p in job.params]) as progress:
        def on_reply(index: int, got: Collected, added: int) -> None:
            progress.advance(added, got.finished, max(got.max_tokens - len(got.token_ids), 0) if got.finished else 0)

        run.listeners.append(on_reply)
        results = run.run()
    return results, run.interrupted


def generate_with_progress(llm: LLM, inputs: list[Prompt], job: Job, activity: Activity) -> list[Result]:
    """``run_prompts`` for a command that needs every result: Ctrl-C ends it with exit code 130."""
    results, interrupted = run_prompts(llm, inputs, job, activity)
    if interrupted:
        activity.line("interrupted")
        raise typer.Exit(INTERRUPTED)
    return results


def check_against_reference(llm: LLM, inputs: list[Prompt], job: Job, results: list[Result],
                            activity: Activity) -> list[Verdict]:
    """transformers greedy, one prompt at a time, compared with each engine result (errors are not re-run)."""
    from core.bench.reference import HFReference, Verdict, compare

    with activity.phase("loading the transformers reference"):
        reference = HFReference(llm.model_dir)
    verdicts = []
    with activity.phase(f"transformers greedy reference, one prompt at a time ({plural(len(inputs), 'prompt')})"):
        for i, (prompt, params, result) in enumerate(zip(inputs, job.params, results)):
            activity.update(f"transformers greedy reference: prompt {i + 1}/{len(inputs)}")
            if result["finish_reason"] == "error":
                verdicts.append(Verdict("error", error=result["error"]))
                continue
            ref = reference.greedy(llm.tokenize(prompt), params.max_tokens, llm.eos_token_ids, params.ignore_eos)
            verdicts.append(compare(result["token_ids"], result["finish_reason"], ref, llm.eos_token_ids))
    return verdicts


def exit_for(results: list[Result], activity: Activity) -> None:
    """Exit code 1 when some results are errors (they have been printed), with a line on stderr that says so."""
    failed = sum(r["finish_reason"] == "error" for r in results)
    if failed:
        errors = "its error is" if failed == 1 else "their errors are"
        where = "the result" if len(results) == 1 else "the results"
        activity.line(f"{failed} of {plural(len(results), 'prompt')} failed; {errors} in {where} (exit code 1)")
        raise typer.Exit(SOME_FAILED)
