"""The transformers baselines, run on the same workload and the same weights as the engine.

* ``hf-sequential``: ``generate`` one prompt at a time, what a user without a serving engine does.
* ``hf-static``: one left-padded batch through ``generate``; every row runs to the longest ``max_tokens``.
* ``hf-continuous``: transformers' own continuous batching over a paged cache (the manager behind
  ``generate_batch``, used directly so each request gets its own ``max_new_tokens``).

EOS is never allowed to end a request early (``min_new_tokens``, or no EOS id for continuous batching), so each
baseline generates the same tokens per request as the engine. Throughput counts the useful tokens, the sum of
``max_tokens``, whatever padding a baseline computes on top.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import torch

from core.arith import pages_for
from core.bench.report import ProgressFn, RunResult
from core.bench.workload import Workload
from core.bench.random_hf import random_hf_model
from core.models.random_spec import RandomSpec
from core.words import plural


def load_hf_model(model_dir: Path | RandomSpec, device: torch.device, dtype: torch.dtype) -> Any:
    """transformers' model of a checkpoint directory, or of a random spec with the engine's very weights."""
    from transformers import AutoModelForCausalLM

    if isinstance(model_dir, RandomSpec):
        return random_hf_model(model_dir, device, dtype)
    # sdpa is what continuous batching pages in transformers 5 (the older 'paged|sdpa' spelling is deprecated)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


def _sampling_kwargs(temperature: float) -> dict[str, Any]:
    if temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature, "top_k": None, "top_p": 1.0}


def _generate(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, new_tokens: int,
              temperature: float, streamer: Any = None, max_time: float | None = None) -> torch.Tensor:
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, pad_token_id=0, streamer=streamer, max_time=max_time,
                              **_sampling_kwargs(temperature))


def hf_sequential(model: Any, workload: Workload, progress: ProgressFn, seconds: float | None = None) -> RunResult:
    device, temperature = model.device, workload.spec.temperature
    total = len(workload.requests)
    start, tokens, done = time.perf_counter(), 0, 0
    for i, req in enumerate(workload.requests):
        if seconds is not None and time.perf_counter() - start > seconds:
            break  # out of time: throughput over the requests that ran
        ids = torch.tensor([req.prompt_ids], device=device)
        _generate(model, ids, torch.ones_like(ids), req.max_tokens, temperature)
        tokens, done = tokens + req.max_tokens, i + 1
        progress("hf-sequential", i + 1, total)
    return RunResult("hf-sequential", time.perf_counter() - start, tokens, done)


class _StepStreamer:
    """Counts generate's decoding steps for the progress callback (the first call carries the prompt)."""

    def __init__(self, progress: ProgressFn, total: int) -> None:
        self.progress, self.total, self.calls = progress, total, -1

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls > 0:
            self.progress("hf-static", self.calls, self.total)

    def end(self) -> None:
        self.progress("hf-static", min(max(self.calls, 0), self.total), self.total)


def left_padded(prompts: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts right-aligned in one [batch, longest] tensor, and the mask of real tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def hf_static(model: Any, workload: Workload, progress: ProgressFn, seconds: float | None = None) -> RunResult:
    """With ``seconds``, generate stops at that time (its ``max_time``) and the useful tokens made by then
    count: each row's steps up to its own ``max_tokens``."""
    ids, mask = left_padded([r.prompt_ids for r in workload.requests])
    steps = max(r.max_tokens for r in workload.requests)
    streamer = _StepStreamer(progress, steps)
    start = time.perf_counter()
    _generate(model, ids.to(model.device), mask.to(model.device), steps, workload.spec.temperature, streamer,
              max_time=seconds)
    wall = time.perf_counter() - start
    done = max(streamer.calls, 0)
    tokens = sum(min(done, r.max_tokens) for r in workload.requests) if done < steps else workload.output_tokens
    return RunResult("hf-static", wall, tokens, len(workload.requests))


def _continuous_config(config_cls: Any, page_size: int, **settings: Any) -> Any:
    """transformers renamed ``block_size`` to ``page_size`` and added options across 5.x releases: pass the page
    size under whichever name this version has, and only the settings it knows."""
    import dataclasses
    import inspect

    known = ({f.name for f in dataclasses.fields(config_cls)} if dataclasses.is_dataclass(config_cls)
             else set(inspect.signature(config_cls).parameters))
    settings["page_size" if "page_size" in known else "block_size"] = page_size
    return config_cls(**{name: value for name, value in settings.items() if name in known})


def hf_continuous(model: Any, workload: Workload, progress: ProgressFn, seconds: float | None = None,
                  page_size: int = 64) -> RunResult:
    """Transformers' continuous batching; the cache is sized to hold the whole workload at once. With
    ``seconds``, requests stream their tokens and the run stops at that time, counting the tokens made."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    requests = workload.requests
    lifetime = sum(pages_for(len(r.prompt_ids) + r.max_tokens, page_size) for r in requests)
    cb_config = _continuous_config(ContinuousBatchingConfig, page_size=page_size, num_blocks=lifetime + len(requests),
                                   max_batch_tokens=2048, max_requests_per_batch=len(requests),
                                   auto_switch_to_flash=False)
    gen_config = GenerationConfig(eos_token_id=-1, pad_token_id=0, max_new_tokens=max(r.max_tokens for r in requests),
                                  **_sampling_kwargs(workload.spec.temperature))
    done, errors = 0, []
    made: dict[Any, int] = {}  # tokens per request id, so far
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with model.continuous_batching_context_manager(generation_config=gen_config, continuous_batching_config=cb_config,
                                                       block=True, timeout=60) as manager:
            start = time.perf_counter()
            streaming = {"streaming": True} if seconds is not None else {}
            ids = [manager.add_request(req.prompt_ids, max_new_tokens=req.max_tokens, eos_token_id=-1, **streaming)
                   for req in requests]
            finished: set = set()
            while done < len(requests):
                if seconds is not None and time.perf_counter() - start > seconds:
                    # the time is up: cancel what still runs, or leaving the context waits for it to finish
                    for request_id in set(ids) - finished:
                        manager.cancel_request(request_id)
                    break
                result = manager.get_result(timeout=1)
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError("the continuous batching loop stopped before every request finished")
                    continue
                made[result.request_id] = len(result.generated_tokens)
                if result.is_finished():
                    done += 1
                    finished.add(result.request_id)
                    if result.error is not None:
                        errors.append(str(result.error))
                    progress("hf-continuous", done, len(requests))
            wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{plural(len(errors), 'request')} failed: {errors[0]}")
    return RunResult("hf-continuous", wall, sum(made.values()), len(requests))
