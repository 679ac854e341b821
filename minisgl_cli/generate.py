"""``minisgl generate``: complete every prompt of a file and print the results (or JSON lines)."""

from __future__ import annotations

import json
import time

import typer

from core.errors import InvalidParamsError
from core.words import plural
from minisgl_cli.console import stderr_console, stdout_console
from minisgl_cli import options as o
from minisgl_cli.engine_options import EngineOptions, with_engine_options
from minisgl_cli.exits import INTERRUPTED
from minisgl_cli.jobs import (check_context, engine_inputs, exit_for, load_job, load_llm, run_prompts,
                              with_model_defaults)
from minisgl_cli.output import StreamPrinter, print_completion
from render.activity import Activity
from render.results import RunSummary, summary_table


@with_engine_options
def generate(prompts: o.Prompts, max_tokens: o.MaxTokens = None, temperature: o.Temperature = None,
             top_k: o.TopK = None, top_p: o.TopP = None, seed: o.Seed = None, ignore_eos: o.IgnoreEos = None,
             chat: o.Chat = False, verbose: o.Verbose = False, stream: o.Stream = None,
             stop: o.Stop = None, logprobs: o.Logprobs = None, presence_penalty: o.PresencePenalty = None,
             frequency_penalty: o.FrequencyPenalty = None, repetition_penalty: o.RepetitionPenalty = None,
             logit_bias: o.LogitBias = None, min_p: o.MinP = None, min_tokens: o.MinTokens = None,
             stop_token_id: o.StopTokenId = None, json_schema: o.JsonSchema = None, regex: o.Regex = None,
             json_out: o.Json = False, engine: EngineOptions = EngineOptions.defaults()) -> None:
    """Generate a continuation for each prompt in PROMPTS, batched, and print them with a summary.

    Exit code 0: every prompt finished; 1: some results are errors (printed too); 130: Ctrl-C (what finished
    is printed)."""
    out, activity = stdout_console(), Activity(stderr_console())
    if stream and json_out:
        raise typer.BadParameter("--stream writes text; use one or the other", param_hint="'--json'")
    if logprobs is not None and not json_out:
        raise InvalidParamsError("--logprobs needs --json: the logprobs are fields of the JSON lines")
    sampling = o.SamplingOptions(max_tokens, temperature, top_k, top_p, seed, ignore_eos,
                                 tuple(stop) if stop else None, logprobs, presence_penalty, frequency_penalty,
                                 repetition_penalty, tuple(logit_bias) if logit_bias else None, min_p, min_tokens,
                                 tuple(stop_token_id) if stop_token_id else None,
                                 o.output_constraint(json_schema, regex))
    job = load_job(prompts, sampling)
    check_context(job, engine, sampling)
    llm = load_llm(engine, activity, verbose)
    job = with_model_defaults(job, llm, sampling)
    inputs = engine_inputs(llm, job, chat)
    separator = "\n" if chat else ""
    if stream is None:
        stream = out.is_terminal and len(inputs) == 1 and not json_out
    printer = (lambda run: StreamPrinter(out, run, job.labels, separator)) if stream else None
    started = time.perf_counter()
    results, interrupted = run_prompts(llm, inputs, job, activity, stream=printer)
    wall = time.perf_counter() - started
    if json_out:
        for i, (spec, result) in enumerate(zip(job.specs, results)):
            line = {"index": i, "prompt": spec.prompt, "text": result["text"], "token_ids": result["token_ids"],
                    "finish_reason": result["finish_reason"], "error": result["error"],
                    "prompt_tokens": result["prompt_tokens"]}
            line.update({key: result[key] for key in ("stop", "logprobs") if key in result})
            print(json.dumps(line, ensure_ascii=False), flush=True)
    else:
        if not stream:
            for i, (label, result) in enumerate(zip(job.labels, results)):
                print_completion(out, i, len(results), label, result, separator=separator)
        out.print()
        out.print(summary_table(RunSummary.of(results, wall)))
    if interrupted:
        finished = sum(r["finish_reason"] != "interrupted" for r in results)
        activity.line(f"interrupted: {finished} of {plural(len(results), 'prompt')} had finished; the others are marked "
                      f"interrupted (exit code 130)")
        raise typer.Exit(INTERRUPTED)
    exit_for(results, activity)
