"""Where the ``cpu`` workload's time goes on a CPU engine: wall time inside each of the engine's pieces, summed over
one run of the workload (as ``minisgl bench`` runs it, after its warm-up), split into the prefill and decode steps.

    .venv/bin/python scripts/cpu_workload_split.py [--threads 2] [--runs 2] [--precision exact]

The pieces are the engine's own methods, wrapped with a clock: the forward step (``Engine.forward_batch``, which
holds everything else below), the C GEMM's three entry points (a plain linear, one with the RMSNorm in front, one
with SiLU-and-mul in front), decode attention in C straight from the QKV output, the LM head (and inside it the
greedy int8 screen), the sampler and the embedding. What a step spends outside them is the Python between the C
calls and the small torch ops. The figures are the last run's.
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any, Callable

import torch

from core import LLM
from core.bench.engine_run import sampling_params, warm_up
from core.bench.workload import make_workload, workload_spec
from core.kernels import cpu_attention, screened_head
from core.kernels.cpu_gemm import PanelWeight

Totals = collections.defaultdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--precision", default="exact")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(precision=args.precision)
    engine = llm.engine
    seconds: Totals[tuple[str, str], float] = collections.defaultdict(float)
    calls: collections.Counter[tuple[str, str]] = collections.Counter()
    phase = ["prefill"]

    def clock(owner: Any, name: str, label: str, on_call: Callable[..., None] = lambda *a: None) -> None:
        inner = getattr(owner, name)

        def timed(*a: Any, **kw: Any) -> Any:
            on_call(*a)
            start = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                seconds[(phase[0], label)] += time.perf_counter() - start
                calls[(phase[0], label)] += 1
        setattr(owner, name, timed)

    def set_phase(batch: Any, *_: Any) -> None:
        phase[0] = "prefill" if batch.is_prefill else "decode"

    clock(engine, "forward_batch", "forward step (all below)", set_phase)
    for name, label in [("linear", "C GEMM"), ("norm_linear", "C GEMM, norm first"),
                        ("silu_mul_linear", "C GEMM, SiLU first")]:
        clock(PanelWeight, name, label)
    clock(cpu_attention.CDecodeAttention, "from_qkv", "C attention")
    clock(type(engine.model.lm_head), "forward", "LM head")
    clock(screened_head.ScreenedHead, "logits", "LM head's int8 screen")
    clock(type(engine.sampler), "sample", "sampler")
    clock(type(engine.model.model.embed_tokens), "forward", "embedding")

    workload = make_workload(workload_spec("cpu"), vocab_size=engine.model.config.vocab_size, seed=0)
    warm_up(llm, workload)
    for _ in range(args.runs):
        seconds.clear()
        calls.clear()
        llm.reset_prefix_cache()
        start = time.perf_counter()
        llm.generate([r.prompt_ids for r in workload.requests], sampling_params(workload))
        wall = time.perf_counter() - start
        print(f"run: {wall:.3f} s, {workload.output_tokens / wall:.1f} tok/s", flush=True)
    for key in sorted(seconds):
        print(f"{key[0]:8s} {key[1]:26s} {seconds[key]:7.3f} s  {calls[key]:5d} calls")


if __name__ == "__main__":
    main()
