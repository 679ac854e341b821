"""Where a decode step's time goes on the GPU: device time of the captured graphs, kernel tables, the sampler.

Run on a CUDA machine after ``. scripts/gpu_env.sh`` (flashinfer from .whl, kernels from .jitcache):

    python3 scripts/gpu_profile.py --out $OUT

Prints, and writes to --out: the device time of one graph replay per batch size (CUDA events around
back-to-back replays, so host work is excluded), the engine's wall time per decode step at the same sizes,
torch.profiler kernel tables of eager decode steps at batch 1 and 256, and the sampler's time on a full
batch of logits. The gap between the engine's step time and the graph's device time is what the host and
the work outside the graph cost.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from pathlib import Path

import torch

from core import LLM, SamplingParams
from core.engine.sampler import SampleArgs

ROOT = Path(__file__).resolve().parents[1]  # where the output folder goes by default

MODEL = "random:qwen3-0.6b"
SECTIONS = ("engine", "graph_kernels", "attention", "kernels_off", "host", "eager")
HOST_FLOOR_MODEL = "random:small-qwen3"  # 4 layers of width 512: a step's time is nearly all host work


def time_device(fn, repeats: int = 50) -> float:
    """Median ms of ``fn`` on the device, timed with events around single calls after a warm-up."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def decode_steps(llm: LLM, batch: int, context: int, tokens: int, temperature: float = 0.0) -> float:
    """Median wall ms of the engine's decode steps with ``batch`` requests of ``context`` prompt tokens."""
    rng = random.Random(batch)
    vocab = min(10000, llm.engine.model_config.vocab_size)
    prompts = [[rng.randrange(vocab) for _ in range(context)] for _ in range(batch)]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=temperature,
                            seed=1 if temperature else None)
    steps: list = []
    llm.add_step_callback(steps.append)
    llm.generate(prompts, params)
    llm.step_callbacks.remove(steps.append)
    llm.reset_prefix_cache()
    decode = [e.elapsed_s * 1e3 for e in steps if e.phase == "decode" and e.batch_size == batch]
    return statistics.median(decode)


def graph_replay_ms(llm: LLM, batch: int, context: int) -> float:
    """Device ms of one replay of the graph for ``batch`` rows, planned for a real batch of that size."""
    decode_steps(llm, batch, context, 4)  # leaves the last plan for this size in the graph's buffers
    graph = llm.engine.graph_runner.graphs[llm.engine.graph_runner.padded_size(batch)]
    with torch.cuda.stream(llm.engine.stream):
        return time_device(graph.replay)


def kernel_table(llm: LLM, batch: int, context: int, tokens: int, temperature: float, path: Path) -> str:
    from torch.profiler import ProfilerActivity, profile

    rng = random.Random(7)
    prompts = [[rng.randrange(10000) for _ in range(context)] for _ in range(batch)]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=temperature,
                            seed=1 if temperature else None)
    llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True))
    llm.reset_prefix_cache()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts, params)
    llm.reset_prefix_cache()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=45, max_name_column_width=70)
    path.write_text(table)
    return table


def sampler_ms(llm: LLM, batch: int) -> dict[str, float]:
    vocab = llm.engine.model_config.vocab_size
    dev = llm.engine.device
    logits = torch.randn(batch, vocab, device=dev)
    args = SampleArgs(temperatures=torch.full((batch,), 0.6, device=dev), top_p=torch.ones(batch, device=dev),
                      seeds=torch.arange(batch, device=dev), positions=torch.full((batch,), 300, device=dev),
                      top_k=torch.full((batch,), -1, device=dev), greedy_rows=torch.zeros(batch, dtype=torch.bool,
                                                                                           device=dev))
    sampler = llm.engine.sampler
    return {"greedy": time_device(lambda: sampler.sample(logits, SampleArgs())),
            "temperature": time_device(lambda: sampler.sample(logits, args)),
            "logits.float()": time_device(lambda: logits.bfloat16().float())}


def graph_time_us(fn, calls: int, repeats: int = 20) -> float:
    """Median device microseconds per call of ``fn(i)`` for i in range(calls), captured as one CUDA graph:
    what a call costs inside a captured decode step, without the host's launch overhead."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(calls):  # lazy initialisation and compilation outside the capture
            fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            fn(i)
    with torch.cuda.stream(stream):
        return time_device(graph.replay, repeats) * 1e3 / calls


def attention_variants() -> list[str]:
    """flashinfer paged decode alone inside a CUDA graph (28 layers' worth of calls, as a decode step makes),
    Qwen3-0.6B's heads, page 16: the CUDA-core kernels the engine uses against the tensor-core ones with and
    without split-k, at the batch sizes and lengths the benchmarks meet."""
    import flashinfer

    dev = torch.device("cuda")
    heads, kv_heads, dim, page, layers = 16, 8, 128, 16, 28
    lines = []
    for batch, context in ((1, 300), (1, 1000), (8, 300), (64, 600), (256, 300), (256, 800)):
        pages_per_req = -(-context // page)
        pools = [torch.randn(batch * pages_per_req, 2, page, kv_heads, dim, dtype=torch.bfloat16, device=dev)
                 for _ in range(layers)]
        indptr = torch.arange(batch + 1, dtype=torch.int32, device=dev) * pages_per_req
        indices = torch.randperm(batch * pages_per_req, device=dev).int()
        last = torch.full((batch,), context - (pages_per_req - 1) * page, dtype=torch.int32, device=dev)
        q = torch.randn(batch, heads, dim, dtype=torch.bfloat16, device=dev)
        results = []
        for tensor_cores, split in ((False, True), (True, True), (True, False)):
            workspace = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
                paged_kv_indptr_buffer=indptr.clone(), paged_kv_indices_buffer=indices.clone(),
                paged_kv_last_page_len_buffer=last.clone())
            extra = {} if not tensor_cores else {"disable_split_kv": not split}
            wrapper.plan(indptr, indices, last, heads, kv_heads, dim, page, q_data_type=torch.bfloat16,
                         kv_data_type=torch.bfloat16, **extra)
            us = graph_time_us(lambda i: wrapper.run(q, (pools[i][:, 0], pools[i][:, 1])), layers)
            gbs = 2 * batch * context * kv_heads * dim * 2 / us / 1e3
            results.append(f"tc={int(tensor_cores)} split={'auto' if split else 0}: {us:.1f} us ({gbs:.0f} GB/s)")
        lines.append(f"decode attention in a graph, batch {batch} context {context}: " + ", ".join(results))
        del pools
    return lines


def graph_kernel_table(llm: LLM, batch: int, context: int, path: Path) -> str:
    """Each kernel's device time inside replays of the decode graph for ``batch`` rows."""
    from torch.profiler import ProfilerActivity, profile

    decode_steps(llm, batch, context, 4)
    graph = llm.engine.graph_runner.graphs[llm.engine.graph_runner.padded_size(batch)]
    with torch.cuda.stream(llm.engine.stream):
        graph.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                graph.replay()
            torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90)
    path.write_text(table)
    return table


def replays_with(variable: str, cases: tuple[tuple[int, int], ...]) -> list[tuple[int, int, float]]:
    """Graph replay times of an engine built with the environment variable ``variable=1`` (a kernel turned off)."""
    os.environ[variable] = "1"
    try:
        llm = LLM(MODEL, page_size=16, max_running_req=256, max_seq_len=2048, kv_cache_gb=20.0)
        try:
            return [(batch, context, graph_replay_ms(llm, batch, context)) for batch, context in cases]
        finally:
            llm.close()
    finally:
        os.environ.pop(variable)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "out" / "profile"))
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, from: {', '.join(SECTIONS)}")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    if sections & {"engine", "graph_kernels"}:
        llm = LLM(MODEL, page_size=16, max_running_req=256, max_seq_len=2048, kv_cache_gb=40.0, log=print)
        if "engine" in sections:
            for batch, context in ((1, 300), (1, 2000), (2, 300), (4, 300), (8, 300), (64, 300), (256, 300),
                                   (256, 800)):
                step = decode_steps(llm, batch, context, 40, temperature=0.6 if batch > 1 else 0.0)
                replay = graph_replay_ms(llm, batch, context)
                say(f"batch {batch:3d} context {context}: engine decode step {step:.3f} ms, "
                    f"graph replay {replay:.3f} ms")
            for name, ms in sampler_ms(llm, 256).items():
                say(f"sampler at batch 256, {name}: {ms:.3f} ms")
            say(f"sampler at batch 1, greedy: {sampler_ms(llm, 1)['greedy']:.3f} ms")
        if "graph_kernels" in sections:
            for batch in (1,):
                table = graph_kernel_table(llm, batch, 300, out / f"graph_kernels_bs{batch}.txt")
                say(f"==== kernels in 10 replays of the batch-{batch} decode graph, context 300\n{table}")
        llm.close()
        del llm
        torch.cuda.empty_cache()
    if "attention" in sections:
        for line in attention_variants():
            say(line)
        torch.cuda.empty_cache()

    if "kernels_off" in sections:
        for variable, what in (("MINISGL_DISABLE_SMALL_DECODE", "flashinfer decode at small batch"),
                               ("MINISGL_DISABLE_FUSED_QKV", "unfused QK-norm/RoPE/KV write"),
                               ("MINISGL_DISABLE_GEMV", "cuBLAS batch-1 linears, separate norms/activation")):
            for batch, context, ms in replays_with(variable, ((1, 300), (1, 2000), (4, 300), (256, 300))):
                say(f"{what}, batch {batch} context {context}: graph replay {ms:.3f} ms")
            torch.cuda.empty_cache()

    if "host" in sections:
        small = LLM(HOST_FLOOR_MODEL, page_size=16, max_running_req=8, max_seq_len=2048, kv_cache_gb=2.0)
        say(f"host floor: engine decode step of {HOST_FLOOR_MODEL} at batch 1: "
            f"{decode_steps(small, 1, 300, 60):.3f} ms, graph replay {graph_replay_ms(small, 1, 300):.3f} ms")
        small.close()
        torch.cuda.empty_cache()

    if "eager" in sections:
        eager = LLM(MODEL, page_size=16, max_running_req=256, max_seq_len=2048, kv_cache_gb=20.0,
                    cuda_graph_max_bs=0)
        table = kernel_table(eager, 1, 300, 6, 0.0, out / "kernels_bs1.txt")
        say(f"==== eager kernels, batch 1, 6 tokens (prefill included)\n{table}")
    (out / "profile.txt").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
