"""Throughput with tensor parallelism: the same workload on 1 and N GPUs, in one run, as a ratio.

    python scripts/gpu_tp_bench.py                          # 256 sequences, Qwen3-0.6B shape, tp 1 and 2
    python scripts/gpu_tp_bench.py --num-seqs 64 --tps 1,2

The workload is ``minisgl bench``'s nanovllm workload (core/bench/workload.py): random prompt ids in
[0, 10000), prompt length and max_tokens each uniform in [100, max_len], temperature 0.6, ignore_eos, seed 0;
throughput is the sum of max_tokens over wall time. A short warm-up generate runs first on each engine.
``minisgl bench --tp N`` is the user-facing way to get these figures;
this script exists so they can be taken before that command knows about tensor parallelism.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import replace

import torch

from core import LLM, SamplingParams
from core.bench.engine_run import sampling_params
from core.bench.workload import make_workload, workload_spec
from core.models.loader import read_model_config
from core.models.weights import resolve_model_dir
from gpu_tp_check import model_spec  # beside this script: Python puts a script's folder on its path


def workload(model: str, n: int, max_len: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """The nanovllm workload with ``n`` requests and lengths up to ``max_len``, over the model's vocabulary."""
    spec = replace(workload_spec("nanovllm"), num_requests=n, prompt_len=(100, max_len), max_tokens=(100, max_len))
    drawn = make_workload(spec, read_model_config(resolve_model_dir(model)).vocab_size)
    return [r.prompt_ids for r in drawn.requests], sampling_params(drawn)


def measure(model: str, tp: int, prompts, params, kv_gb: float, max_running_req: int) -> float:
    llm = LLM(model, tp=tp, kv_cache_gb=kv_gb, max_running_req=max_running_req)
    try:
        llm.generate(prompts[:4], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate(prompts, params)
        torch.cuda.synchronize()
        return sum(p.max_tokens for p in params) / (time.perf_counter() - start)
    finally:
        llm.close()
        del llm
        gc.collect()
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random:qwen3-0.6b")
    parser.add_argument("--tps", default="1,2")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--kv-cache-gb", type=float, default=40.0)
    parser.add_argument("--max-running-req", type=int, default=256)
    args = parser.parse_args()
    model = model_spec(args.model)
    prompts, params = workload(model, args.num_seqs, args.max_len)
    results = {}
    for tp in (int(t) for t in args.tps.split(",")):
        results[tp] = measure(model, tp, prompts, params, args.kv_cache_gb, args.max_running_req)
        print(f"tp={tp}: {results[tp]:,.0f} tok/s", flush=True)
    base = results.get(1)
    print(f"| tp | tok/s | vs tp=1 |\n|---|---|---|")
    for tp, value in results.items():
        print(f"| {tp} | {value:,.0f} | {value / base:.2f}x |" if base else f"| {tp} | {value:,.0f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
