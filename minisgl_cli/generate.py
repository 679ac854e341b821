"""``minisgl generate``: complete every prompt of a file and print the results (or JSON lines)."""

from __future__ import annotations

import json
import time

from rich.console import Console

from minisgl_cli import options as o
from minisgl_cli.jobs import engine_inputs, generate_with_progress, load_job, load_llm
from render.results import RunSummary, completion_block, summary_table


def generate(prompts: o.Prompts, max_tokens: o.MaxTokens = None, temperature: o.Temperature = None,
             top_k: o.TopK = None, top_p: o.TopP = None, seed: o.Seed = None, ignore_eos: o.IgnoreEos = None,
             model: o.Model = None, cache: o.Cache = o.DEFAULT_CACHE, page_size: o.PageSize = o.DEFAULT_PAGE_SIZE,
             max_running: o.MaxRunning = o.DEFAULT_MAX_RUNNING, num_pages: o.NumPages = None, chat: o.Chat = False,
             attention: o.Attention = None, cuda_graph_max_bs: o.CudaGraphMaxBs = None, tp: o.Tp = 1,
             dtype: o.Dtype = None, kv_dtype: o.KvDtype = 'auto',
             json_out: o.Json = False) -> None:
    """Generate a continuation for each prompt in PROMPTS, batched, and print them with a summary."""
    out, err = Console(), Console(stderr=True)
    job = load_job(prompts, o.SamplingOptions(max_tokens, temperature, top_k, top_p, seed, ignore_eos))
    llm = load_llm(o.EngineOptions(model, cache, page_size, max_running, num_pages, chat, attention,
                                   cuda_graph_max_bs, tp, dtype, kv_dtype), err)
    inputs = engine_inputs(llm, job, chat)
    started = time.perf_counter()
    results = generate_with_progress(llm, inputs, job, err)
    wall = time.perf_counter() - started
    if json_out:
        for i, (spec, result) in enumerate(zip(job.specs, results)):
            print(json.dumps({"index": i, "prompt": spec.prompt, "text": result["text"],
                              "token_ids": result["token_ids"], "finish_reason": result["finish_reason"],
                              "error": result["error"], "prompt_tokens": result["prompt_tokens"]},
                             ensure_ascii=False), flush=True)
        return
    for i, (label, result) in enumerate(zip(job.labels, results)):
        out.print(completion_block(i, len(results), label, result, separator="\n" if chat else ""))
    out.print()
    out.print(summary_table(RunSummary.of(results, wall)))
