"""A model's step costs on the GPU beside their floors, and what its start left of the card.

Run on a CUDA machine after ``. scripts/gpu_env.sh``:

    python3 scripts/gpu_steps.py --part start --model random:qwen3-8b
    python3 scripts/gpu_steps.py --part steps --model random:qwen3-8b --out $OUT

Each line is printed as soon as it is measured, with the seconds since the start. On a fresh machine the first
start compiles flashinfer's and Triton's kernels: with the 8B shape on an H100 neither part had printed its first
line after 200 s (start) and 120 s (steps, the second process); give each 300 s.

1. Start: the engine with default options (the memory plan's figures: free after the weights, counted for the CUDA
   wing, the reserve, the pool; what the card has free once it is ready), and a short run.
2. Steps, on an engine of 256 rows: a prefill pass of each captured chunk size (its graph's replay, device time,
   after a real chunk of that size planned it, and the engine's wall step), the chunk made of 512-token prompts
   as the workload's are and then of one prompt, and a decode step at 1/32/128/256 rows (likewise), each beside
   its floor: a prefill's linears' FLOPs and its attention's FLOPs at the measured bf16 matmul rate, a decode
   step's weights and KV bytes at the measured bandwidth.
3. Where a prefill step's time goes: the kernels of the 2,048-token and the largest prefill graphs' replays (chunks
   of 512-token prompts) by family.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from core import LLM, SamplingParams
from core.bench.floor import ModelCosts, measure_ceilings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_profile import step_graph, time_device  # noqa: E402

GIB = 1 << 30
STARTED = time.perf_counter()
DECODE_ROWS = (1, 32, 128, 256)
CONTEXT = 512  # each decode row's prompt
WORKLOAD_PROMPT = 512  # a prefill chunk's prompts, as the nano-vllm workload's (100 to 1,024 tokens) hold
FAMILIES = (("attention", r"prefill|decode|attention"), ("GEMM", r"gemm|cutlass|nvjet|sm90|xmma|splitk|matmul"),
            ("norm", r"norm"), ("activation", r"silu|act_and_mul|gelu"), ("QKV, RoPE, KV write", r"qkv|rope"),
            ("copies", r"copy|memcpy|memset|fill|index|gather|cat"))


def say(text: str) -> None:
    """A line as soon as it is known, with the seconds since the start: a run cut short keeps what it measured."""
    print(f"[{time.perf_counter() - STARTED:6.1f}s] {text}", flush=True)


def start_run(model: str) -> None:
    """The engine with default options: its memory plan against what its start left free, and a short run."""
    llm = LLM(model, log=say)
    engine, gib = llm.engine, lambda b: f"{b / GIB:.2f} GiB"
    memory, pool = engine.memory, engine.num_pages * engine.page_size * engine.kv_bytes_per_token
    free_now, total = torch.cuda.mem_get_info(engine.device)
    used_after_pool = memory.free - pool - free_now
    say(f"start of {model} with default options on {torch.cuda.get_device_name()} ({gib(total)}): free after the "
        f"weights {gib(memory.free)}; counted for the CUDA wing {gib(memory.counted)} {engine.footprint}; "
        f"reserve {gib(memory.reserve)}; pool {gib(pool)}; taken after the pool (install, graphs, warm-up) "
        f"{gib(used_after_pool)}; free when ready {gib(free_now)}")
    say(engine.describe())
    out = llm.generate([[random.randrange(10000) for _ in range(300)] for _ in range(8)],
                       SamplingParams(max_tokens=32, ignore_eos=True))
    say(f"a run of 8 requests made {sum(len(o['token_ids']) for o in out)} tokens")
    llm.close()


def prompt_sizes(tokens: int, prompt: int | None) -> list[int]:
    return [tokens] if prompt is None else [min(prompt, tokens - i) for i in range(0, tokens, prompt)]


def run_prompts(llm: LLM, sizes: list[int], params: SamplingParams) -> list:
    """Random prompts of these sizes run to the end, the prefix cache emptied after; the run's step events."""
    steps: list = []
    llm.add_step_callback(steps.append)
    llm.generate([[random.randrange(10000) for _ in range(n)] for n in sizes], params)
    llm.scheduler.step_callbacks.remove(steps.append)
    llm.reset_prefix_cache()
    return steps


def run_chunk(llm: LLM, tokens: int, prompt: int | None) -> list:
    """One prefill step of ``tokens`` tokens, run for real (it plans the graph's attention): one prompt, or prompts
    of ``prompt`` tokens as the workload's chunks hold; its step events."""
    return run_prompts(llm, prompt_sizes(tokens, prompt), SamplingParams(max_tokens=1))


def prefill_rows(llm: LLM, costs: ModelCosts, rate: float, prompt: int | None) -> list[dict]:
    """Each captured prefill size: one chunk of that many tokens (``run_chunk``), then the graph's replays timed;
    the floors are the linears' FLOPs and attention's FLOPs at ``rate`` (FLOP/s)."""
    runner = llm.engine.graphs.prefill
    rows = []
    for n in runner.sizes:
        if n < 512:
            continue
        steps = run_chunk(llm, n, prompt)
        with torch.cuda.stream(llm.engine.stream):
            device_ms = time_device(runner.graphs[n].replay, repeats=10)
        gemm_ms = n * (costs.flops_per_token - costs.head_flops) / rate * 1e3
        pairs = sum(k * (k + 1) / 2 for k in prompt_sizes(n, prompt))
        attn_ms = pairs * costs.attn_flops_per_pair / rate * 1e3
        rows.append(dict(tokens=n, prompt=prompt or n,
                         step_wall_ms=round(sum(e.elapsed_s for e in steps if e.phase == "prefill") * 1e3, 2),
                         replay_ms=round(device_ms, 2), gemm_floor_ms=round(gemm_ms, 2),
                         attention_floor_ms=round(attn_ms, 3), of_gemm_floor=round(gemm_ms / device_ms, 3),
                         of_floor=round((gemm_ms + attn_ms) / device_ms, 3)))
        say(f"prefill {rows[-1]}")
    return rows


def decode_rows(llm: LLM, costs: ModelCosts, rate: float, bandwidth: float, tokens: int = 48) -> list[dict]:
    """A decode step at each row count with CONTEXT-token prompts, run long enough for every row to decode
    together: the engine's median wall step at that count, then the graph's replay where the run's last step had
    that many rows (the plan it left is then the graph's), beside the floor (weights once and every row's KV at
    ``bandwidth``, or the FLOPs, the longer)."""
    rows = []
    for batch in DECODE_ROWS:
        steps = run_prompts(llm, [CONTEXT] * batch, SamplingParams(max_tokens=tokens, ignore_eos=True,
                                                                    temperature=0.6 if batch > 1 else 0.0))
        decode = [e for e in steps if e.phase == "decode"]
        wall = statistics.median(e.elapsed_s * 1e3 for e in decode if e.batch_size == batch)
        # the graphs share their attention plan's page lists, planned for the last step: a replay of this size
        # reads them safely only when that step had this many rows (a prompt chunked over several steps makes the
        # first requests finish first, and the last step smaller); else the wall step stands alone
        replay = None
        if decode and decode[-1].batch_size == batch:
            with torch.cuda.stream(llm.engine.stream):
                replay = time_device(step_graph(llm, batch).replay)
        kv = batch * (CONTEXT + tokens) * costs.kv_bytes_per_token
        floor = max((costs.weight_bytes + kv) / bandwidth, batch * costs.flops_per_token / rate) * 1e3
        measured = replay if replay is not None else wall
        rows.append(dict(rows=batch, replay_ms=None if replay is None else round(replay, 3),
                         step_wall_ms=round(wall, 3), floor_ms=round(floor, 3), of_floor=round(floor / measured, 3)))
        say(f"decode {rows[-1]}")
    return rows


def prefill_kernel_lines(llm: LLM, n: int, prompt: int | None, replays: int = 3) -> list[str]:
    """The prefill graph of ``n`` tokens' replays under torch.profiler (planned by ``run_chunk``), its kernels'
    device time a replay by family."""
    from torch.profiler import ProfilerActivity, profile

    runner = llm.engine.graphs.prefill
    run_chunk(llm, n, prompt)
    with torch.cuda.stream(llm.engine.stream), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            runner.graphs[n].replay()
        torch.cuda.synchronize()
    kernels = [(e.key, e.device_time_total / 1e3 / replays) for e in prof.key_averages() if e.device_time_total > 0]
    families: dict[str, float] = defaultdict(float)
    for name, ms in kernels:
        family = next((f for f, pattern in FAMILIES if re.search(pattern, name, re.I)), "other")
        families[family] += ms
    total = sum(families.values())
    lines = [f"prefill graph of {n:,} tokens ({f'prompts of {prompt}' if prompt else 'one prompt'}), device ms a "
             f"replay by kernel family (sum {total:.2f} ms):"]
    lines += [f"  {family:<22} {ms:8.2f}  {ms / total:5.1%}" for family, ms in sorted(families.items(),
                                                                                    key=lambda kv: -kv[1])]
    lines += ["  the largest kernels:"] + [f"  {ms:8.2f}  {name[:110]}" for name, ms in
                                           sorted(kernels, key=lambda kv: -kv[1])[:10]]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="random:qwen3-8b")
    parser.add_argument("--out", default="out")
    parser.add_argument("--part", choices=("start", "steps"), default="steps",
                        help="1 (start), or 2 and 3 (steps): one process each, so each has the card to itself")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(0)
    if args.part == "start":
        start_run(args.model)
        return 0
    llm = LLM(args.model, max_running_req=256, max_seq_len=8192 + 64, log=say)  # an 8,192-token prompt fits
    cfg, engine = llm.engine.model_config, llm.engine
    ceilings = measure_ceilings(engine.device, engine.dtype)
    costs = ModelCosts.of(cfg, engine.dtype.itemsize, engine.kv_bytes_per_token)
    rate, bandwidth = ceilings.matmul_gflops * 1e9, ceilings.stream_gbps * 1e9
    say(f"ceilings: {rate / 1e12:.0f} TFLOP/s bf16 matmul, {bandwidth / 1e9:.0f} GB/s")
    result = dict(model=args.model, card=torch.cuda.get_device_name(), matmul_tflops=round(rate / 1e12, 1),
                  copy_gbps=round(bandwidth / 1e9),
                  prefill=prefill_rows(llm, costs, rate, WORKLOAD_PROMPT) + prefill_rows(llm, costs, rate, None),
                  decode=decode_rows(llm, costs, rate, bandwidth))
    (out / "steps.json").write_text(json.dumps(result, indent=1))
    kernel_lines = prefill_kernel_lines(llm, 2048, WORKLOAD_PROMPT) + prefill_kernel_lines(
        llm, llm.engine.graphs.prefill.sizes[-1], WORKLOAD_PROMPT)
    llm.close()
    lines = ["prefill tokens | prompt | step wall ms | graph replay ms | GEMM floor ms | attention floor ms | "
             "of GEMM floor | of GEMM + attention floor"]
    lines += [" | ".join(str(r[k]) for k in ("tokens", "prompt", "step_wall_ms", "replay_ms", "gemm_floor_ms",
                                              "attention_floor_ms", "of_gemm_floor", "of_floor"))
              for r in result["prefill"]]
    lines += ["decode rows | graph replay ms | step wall ms | floor ms | of floor"]
    lines += [" | ".join(str(r[k]) for k in ("rows", "replay_ms", "step_wall_ms", "floor_ms", "of_floor"))
              for r in result["decode"]]
    print("\n".join(kernel_lines + lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
