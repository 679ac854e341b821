"""``minisgl verify``: the engine batched against transformers greedy one prompt at a time, token by token."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Literal

import typer

import sample_prompts
from minisgl_cli.console import stderr_console, stdout_console
from minisgl_cli import options as o
from core.config import DEFAULTS
from core.errors import InvalidParamsError
from minisgl_cli.engine_options import SAMPLING_DEFAULTS, EngineOptions, flag, with_engine_options
from minisgl_cli.exits import SOME_FAILED
from minisgl_cli.jobs import (check_against_reference, check_context, engine_inputs, generate_with_progress,
                              load_job, load_llm, require_greedy)
from render.activity import Activity
from render.verify import summary_line, verify_table

if TYPE_CHECKING:
    from core.llm import LLM

REFERENCES = ("hf",)

Ref = Annotated[Literal[REFERENCES], typer.Option("--ref",
                                  help="The reference: 'hf' is transformers, float32 on the CPU.")]


@with_engine_options
def verify(prompts: o.OptionalPrompts = None, ref: Ref = "hf", json_out: o.Json = False,
           max_tokens: o.MaxTokens = None, temperature: o.Temperature = None, top_k: o.TopK = None,
           top_p: o.TopP = None, seed: o.Seed = None, ignore_eos: o.IgnoreEos = None, chat: o.Chat = False,
           verbose: o.Verbose = False,
           engine: EngineOptions = EngineOptions.defaults()) -> None:
    """Check the engine's greedy output for PROMPTS against transformers, token for token.

    Exit code 0 when every prompt matches exactly, 1 otherwise (a difference, or a prompt the engine
    refused). At the first differing position the table
    shows both tokens and whether it is a near-tie (the engine's token within the reference's top-5)."""
    activity = Activity(stderr_console())
    sampling = o.SamplingOptions(max_tokens, temperature, top_k, top_p, seed, ignore_eos)
    job = load_job(prompts or sample_prompts.path(), sampling)
    require_greedy(job, sampling)
    refuse_sampling_defaults(engine)
    check_context(job, engine, sampling)
    llm = load_llm(engine, activity, verbose)
    inputs = engine_inputs(llm, job, chat)
    results = generate_with_progress(llm, inputs, job, activity)
    verdicts = check_against_reference(llm, inputs, job, results, activity)
    if json_out:
        for i, (spec, result, verdict) in enumerate(zip(job.specs, results, verdicts)):
            print(json.dumps({"index": i, "prompt": spec.prompt, "token_ids": result["token_ids"],
                              "text": result["text"], **verdict.to_dict()}, ensure_ascii=False), flush=True)
    else:
        out = stdout_console()
        out.print(verify_table(job.labels, results, verdicts, lambda t: _token_text(llm, t)))
        out.print(summary_line(verdicts))
    if not all(v.exact for v in verdicts):
        raise typer.Exit(SOME_FAILED)


def _token_text(llm: LLM, token: int | None) -> str:
    """A token as text; None stands for the EOS the engine stopped at."""
    if token is None:
        return llm.tokenizer.decode(sorted(llm.eos_token_ids)[:1])
    return llm.tokenizer.decode([token])


def refuse_sampling_defaults(engine: EngineOptions) -> None:
    """verify compares the model's plain greedy decoding: a model's sampling defaults have no part in it, so
    asking for some is a mistake to say, not an option to ignore."""
    given = [flag(name) for name in SAMPLING_DEFAULTS if engine.values[name] != DEFAULTS[name]]
    if given:
        raise InvalidParamsError(f"verify compares plain greedy decoding and takes no sampling defaults: leave out "
                                 f"{' and '.join(given)}")
