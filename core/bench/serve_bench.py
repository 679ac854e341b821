"""The engine's side of ``minisgl bench --serve``: its workload, the engine options both of its engines get, and
the offline figure beside which the server's rates are read.

The offline pass is ``LLM.generate`` on the same requests in this process, built with the same options as the
server, so the ratio between the two is what the server adds (HTTP, streaming, arrivals spread in time) and not
a difference of configuration. Both would hold the model, so the offline engine is freed before a server starts.
"""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import Any, Callable

import torch

from core.bench.engine_run import run_engine, warm_up
from core.bench.report import ProgressFn, RunResult
from core.bench.runner import BenchOptions, metered
from core.bench.workload import Workload, make_workload, workload_spec
from core.llm import LLM
from core.models.loader import read_model_config
from core.models.weights import resolve_model_dir
from core.words import plural

MAX_RUNNING = 256  # the batch both engines hold by default: every request, up to this many


def serve_workload(name: str | None, model: str | None, requests: int | None, seed: int,
                   log: Callable[[str], None] | None = None) -> tuple[Workload, int]:
    """The workload drawn as ``minisgl bench`` draws it, made greedy, and the model's vocabulary size (its ids
    are drawn below it). Only the model's config is read, not its weights: with ``--url`` the model is the
    server's."""
    spec = workload_spec(BenchOptions(workload=name).workload_name())
    cfg = read_model_config(resolve_model_dir(model, log))
    workload = make_workload(replace(spec, temperature=0.0), cfg.vocab_size, seed, requests,
                             cfg.max_position_embeddings)
    return workload, cfg.vocab_size


def engine_settings(workload: Workload, *, device: str | None, tp: int, kv_dtype: str | None, precision: str,
                    page_size: int | None, max_running: int | None, threads: int | None = None,
                    admission: str = "estimate") -> dict[str, Any]:
    """The engine options (EngineConfig's names) of the offline engine and of the server alike: ``minisgl
    bench``'s page size and a batch that holds every request (up to MAX_RUNNING), the context cut to the
    longest request so that the KV pool is sized alike."""
    settings: dict[str, Any] = {
        "tp": tp, "kv_dtype": kv_dtype or "auto", "precision": precision, "admission": admission,
        "page_size": BenchOptions(device=device, page_size=page_size).engine_page_size(),
        "max_running_req": max_running or min(len(workload.requests), MAX_RUNNING),
        "max_seq_len": max(len(r.prompt_ids) + r.max_tokens for r in workload.requests)}
    if device is not None:
        settings["device"] = device
    if threads is not None:
        settings["threads"] = threads
    return settings


def run_offline(model: str | None, settings: dict[str, Any], workload: Workload, progress: ProgressFn,
                say: Callable[[str], None]) -> RunResult:
    """The workload through ``LLM.generate`` after a warm-up run, then the engine freed (its memory too, on
    CUDA, where a server started next needs it)."""
    say(f"loading {model or 'the embedded model'} into the offline engine")
    with LLM(model, log=say, **settings) as llm:
        say(f"warming up the offline engine: the {plural(len(workload.requests), 'request')} cut to a few tokens "
            "each")
        warm_up(llm, workload)
        result, _ = metered(lambda: run_engine(llm, workload, lambda _, done, total: progress("offline", done, total)))
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return replace(result, name="offline")
