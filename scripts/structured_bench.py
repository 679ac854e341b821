"""Structured output's cost: the same requests free and each under a small JSON schema, output tokens per second.

One engine, one process: a warm-up of each kind, then rounds that alternate free and constrained runs of the same
requests (the workload's prompts and max_tokens, EOS ignored, the workload's temperature and seeds), the prefix
cache emptied before each run. A request whose grammar completes stops early, so the free run gives each request
the tokens its constrained run generated: the two runs hold the same batches, step for step, and differ only in
the masks. Prints each run and the median ratio (constrained / free).

On the CPU (the embedded SmolLM2-135M, 16 requests of the cpu workload, all in one batch):

    .venv/bin/python scripts/structured_bench.py --workload cpu --requests 16

On one GPU (the nano-vllm workload's 256 requests, pages of 128 tokens as `minisgl bench` uses there):

    python3 scripts/structured_bench.py --model random:qwen3-0.6b --workload nanovllm --page-size 128
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from core import LLM
from core.bench.engine_run import sampling_params
from core.bench.workload import make_workload, workload_spec
from core.constraint import Constraint

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["text"],
          "properties": {"text": {"type": "string", "pattern": "^[a-z ]*$"}}}


STEPS: list = []  # the step events of the run under way (a step callback appends them)


def run(llm: LLM, prompts: list[list[int]], params: list) -> tuple[float, float, list[int]]:
    """One timed run: output tokens per second of wall time and per second of this process's CPU time (on a CPU
    that others share, the steadier of the two), and each request's output tokens."""
    llm.reset_prefix_cache()
    STEPS.clear()
    started, cpu = time.perf_counter(), time.process_time()
    out = llm.generate(prompts, params)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    lengths = [len(r["token_ids"]) for r in out]
    return sum(lengths) / wall, sum(lengths) / cpu, lengths


def step_times() -> str:
    """Where the run's time went: its decode and prefill steps, and the host's time filling masks (of which the
    loop waited for what the other host work of the step did not hide)."""
    decode = [e for e in STEPS if e.phase == "decode"]
    prefill = [e for e in STEPS if e.phase != "decode"]
    mean_ms = lambda xs: 1e3 * statistics.fmean(xs) if xs else 0.0
    masks, waited = mean_ms([e.mask_fill_s for e in decode]), mean_ms([e.mask_wait_s for e in decode])
    return (f"{len(decode)} decode steps of {mean_ms([e.elapsed_s for e in decode]):.2f} ms "
            f"(masks {masks:.2f}, waited {waited:.2f}), {len(prefill)} prefill steps, "
            f"{sum(e.elapsed_s for e in prefill):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--workload", default="cpu", choices=["cpu", "nanovllm"])
    parser.add_argument("--requests", type=int, default=None, help="default: the workload's")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--page-size", type=int, default=1)
    args = parser.parse_args()
    spec = workload_spec(args.workload)
    count = args.requests or spec.num_requests
    llm = LLM(args.model, page_size=args.page_size, max_running_req=max(count, 1))
    llm.add_step_callback(STEPS.append)
    workload = make_workload(spec, llm.vocab_size, num_requests=count, max_seq_len=llm.max_seq_len)
    prompts = [r.prompt_ids for r in workload.requests]
    constraint = Constraint.json_schema(SCHEMA)
    constrained = [replace(p, constraint=constraint) for p in sampling_params(workload)]
    print(f"model {args.model or 'SmolLM2-135M-Instruct'} on {llm.device}, {count} requests of the {spec.name} "
          f"workload, {sum(p.max_tokens for p in constrained):,} output tokens at most", flush=True)
    llm.generate(prompts, [replace(p, max_tokens=min(p.max_tokens, 8)) for p in constrained])  # warm-up
    lengths = run(llm, prompts, constrained)[2]  # what each request generates under its grammar
    free = [replace(p, constraint=None, max_tokens=n) for p, n in zip(constrained, lengths)]
    llm.generate(prompts, [replace(p, max_tokens=min(p.max_tokens, 8)) for p in free])
    walls, cpus = [], []
    for i in range(args.rounds):
        free_rate, free_cpu, tokens = run(llm, prompts, free)
        free_steps = step_times()
        rate, cpu, _ = run(llm, prompts, constrained)
        walls.append(rate / free_rate)
        cpus.append(cpu / free_cpu)
        print(f"round {i + 1}, {sum(tokens):,} tokens each: free {free_rate:,.1f} tok/s ({free_cpu:,.1f} per CPU "
              f"second), constrained {rate:,.1f} tok/s ({cpu:,.1f}): {walls[-1]:.3f} ({cpus[-1]:.3f})", flush=True)
        print(f"  free: {free_steps}\n  constrained: {step_times()}", flush=True)
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(f"constrained / free, median of {args.rounds}: {wall:.3f} of the tokens a second (cost {100 * (1 - wall):.1f}%),"
          f" {cpu:.3f} of the tokens a CPU second (cost {100 * (1 - cpu):.1f}%)")


if __name__ == "__main__":
    main()
