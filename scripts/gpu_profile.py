"""Where a decode step's time goes on the GPU: device time of the captured graphs, kernel tables, the sampler.

Run on a CUDA machine after ``. scripts/gpu_env.sh`` (flashinfer from .whl, kernels from .jitcache):

    python3 scripts/gpu_profile.py --out $OUT

Prints, and writes to --out: the device time of one graph replay per batch size (CUDA events around
back-to-back replays, so host work is excluded), the engine's wall time per decode step at the same sizes,
torch.profiler kernel tables of eager decode steps at batch 1 and 256, and the sampler's time on a full
batch of logits. The gap between the engine's step time and the graph's device time is what the host and
the work outside the graph cost.

``--sections workload`` places the nano-vllm workload's wall time against its floor (see workload_budget):

    python3 scripts/gpu_profile.py --sections workload --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from core import LLM, SamplingParams
from core.bench.engine_run import sampling_params, warm_up
from core.bench.floor import Ceilings, ModelCosts, measure_ceilings, workload_floor
from core.bench.workload import BenchRequest, make_workload, workload_spec
from core.engine.sampler import SampleArgs, Sampler

ROOT = Path(__file__).resolve().parents[1]  # where the output folder goes by default
MODEL = "random:qwen3-0.6b"
SECTIONS = ("engine", "graph_kernels", "attention", "kernels_off", "host", "eager", "pdl", "workload", "prefill")
DEFAULT_SECTIONS = SECTIONS[:-3]  # the dependent-launch comparison, the workload budget and prefill when asked for
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
    llm.scheduler.step_callbacks.remove(steps.append)
    llm.reset_prefix_cache()
    decode = [e.elapsed_s * 1e3 for e in steps if e.phase == "decode" and e.batch_size == batch]
    return statistics.median(decode)


def graph_replay_ms(llm: LLM, batch: int, context: int) -> float:
    """Device ms of one replay of the graph for ``batch`` rows, planned for a real batch of that size."""
    decode_steps(llm, batch, context, 4)  # leaves the last plan for this size in the graph's buffers
    graph = step_graph(llm, batch)
    with torch.cuda.stream(llm.engine.stream):
        return time_device(graph.replay)


def step_graph(llm: LLM, batch: int) -> torch.cuda.CUDAGraph:
    """The graph a decode step of ``batch`` rows replays as decode_steps runs it: greedy at batch 1 (where the
    screened LM head has a graph of its own), with temperature above."""
    runner = llm.engine.graphs.decode
    size = runner.padded_size(batch)
    return runner.graphs[size, batch == 1 and size in runner.greedy_sizes]


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
    compiled = Sampler(dev)  # torch.compile's race, what MINISGL_DISABLE_TRITON_SAMPLER=1 runs
    return {"greedy": time_device(lambda: sampler.sample(logits, SampleArgs())),
            "temperature": time_device(lambda: sampler.sample(logits, args)),
            "temperature, torch.compile race": time_device(lambda: compiled.sample(logits, args)),
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
    graph = step_graph(llm, batch)
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


def prefill_lines(path: Path, requests: int = 14, prompt: int = 585) -> list[str]:
    """One prefill step of ``requests`` prompts of ``prompt`` tokens (8,190 tokens: one of the workload's
    chunks), as the engine runs it at page size 16: its wall time over five runs against the FLOPs at the
    matmul rate, then its kernels under torch.profiler (device times; the profiler slows only the host)."""
    from torch.profiler import ProfilerActivity, profile

    llm = LLM(MODEL, page_size=16, max_running_req=256, max_seq_len=2048, kv_cache_gb=20.0)
    rng = random.Random(3)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    steps: list = []
    llm.add_step_callback(steps.append)
    walls = []
    for _ in range(6):  # the first is the warm-up
        prompts = [[rng.randrange(10000) for _ in range(prompt)] for _ in range(requests)]
        steps.clear()
        llm.generate(prompts, params)
        llm.reset_prefix_cache()
        walls.append(sum(e.elapsed_s for e in steps if e.phase == "prefill") * 1e3)
    costs = ModelCosts.of(llm.engine.model_config, 2.0, 0.0)  # the FLOPs only
    flops = workload_floor(costs, [BenchRequest([0] * prompt, 1)] * requests, Ceilings(1.0, 1.0)).prefill_flops
    ceilings = measure_ceilings(llm.engine.device, torch.bfloat16)
    floor_ms = flops / (ceilings.matmul_gflops * 1e9) * 1e3
    lines = [f"prefill of {requests} x {prompt} tokens: {statistics.median(walls[1:]):.2f} ms "
             f"(runs {', '.join(f'{w:.1f}' for w in walls[1:])}), floor {floor_ms:.2f} ms "
             f"({flops / 1e12:.2f} TFLOP at {ceilings.matmul_gflops / 1e3:.0f} TFLOP/s)"]
    prompts = [[rng.randrange(10000) for _ in range(prompt)] for _ in range(requests)]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts, params)
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=90)
    path.write_text(table)
    llm.close()
    return lines + [f"==== kernels of one prefill step (max_tokens 1: no decode step follows)\n{table}"]


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


def dependent_launch_lines(rounds: int = 2) -> list[str]:
    """Batch-1 and small-batch decode with the Triton kernels as programmatic dependent launches and as plain
    launches (MINISGL_DISABLE_PDL=1), engines built alternately so the machine's drift touches both."""
    cases = ((1, 300), (1, 2000), (2, 300), (4, 300))
    results: dict[str, list[list[tuple[float, float]]]] = {"plain": [], "dependent": []}
    for _ in range(rounds):
        for name in ("plain", "dependent"):
            if name == "plain":
                os.environ["MINISGL_DISABLE_PDL"] = "1"
            try:
                llm = LLM(MODEL, page_size=16, max_running_req=256, max_seq_len=2048, kv_cache_gb=20.0)
                results[name].append([(decode_steps(llm, b, c, 40), graph_replay_ms(llm, b, c)) for b, c in cases])
                llm.close()
            finally:
                os.environ.pop("MINISGL_DISABLE_PDL", None)
            torch.cuda.empty_cache()
    lines = []
    for i, (batch, context) in enumerate(cases):
        step = {n: statistics.median(r[i][0] for r in rs) for n, rs in results.items()}
        replay = {n: statistics.median(r[i][1] for r in rs) for n, rs in results.items()}
        lines.append(f"batch {batch} context {context}: engine step plain {step['plain']:.3f} ms, dependent "
                     f"{step['dependent']:.3f} ms; graph replay plain {replay['plain']:.3f} ms, dependent "
                     f"{replay['dependent']:.3f} ms ({replay['plain'] / replay['dependent']:.2f}x)")
    return lines


GRID_BATCHES = (1, 8, 32, 64, 128, 192, 256)  # captured sizes at which the decode graph's device time is measured
GRID_CONTEXTS = (300, 1500)  # two prompt lengths: the replay time's intercept and its slope per cached token
SAMPLER_BATCHES = (1, 32, 128, 256)
BINS = ((256, 256), (129, 255), (33, 128), (1, 32))  # decode batch sizes, each bin a row of the budget


def step_record(event) -> dict:
    """What the budget needs of a step: its phase, rows, tokens, time between results, and the keys it read
    (for a decode step, the cached tokens its rows attend to; for a prefill step, the query-key pairs)."""
    context = sum(r.cached_len + r.extend_len for r in event.reqs)
    pairs = sum(r.extend_len * (r.cached_len + (r.extend_len + 1) / 2) for r in event.reqs)
    return {"phase": event.phase, "batch": event.batch_size, "tokens": event.num_tokens, "s": event.elapsed_s,
            "context": context, "pairs": pairs}


def _sync(llm: LLM) -> None:
    if llm.device.type == "cuda":
        torch.cuda.synchronize(llm.device)


def timed_workload(llm: LLM, workload, record: bool) -> tuple[float, int, list[dict]]:
    """Wall seconds and tokens of the whole workload through ``generate``, with every step's record when asked
    (recording makes the scheduler report waits and KV use each step: a little host work more)."""
    steps: list[dict] = []

    def keep(event) -> None:
        steps.append(step_record(event))

    if record:
        llm.add_step_callback(keep)
    try:
        _sync(llm)
        start = time.perf_counter()
        outputs = llm.generate([r.prompt_ids for r in workload.requests], sampling_params(workload))
        _sync(llm)
        wall = time.perf_counter() - start
    finally:
        if record:
            llm.scheduler.step_callbacks.remove(keep)
        llm.reset_prefix_cache()
    return wall, sum(len(o["token_ids"]) for o in outputs), steps


def replay_grid(llm: LLM) -> list[dict]:
    """Device ms of one decode-graph replay at each grid batch and context, planned for a real batch."""
    runner = llm.engine.graphs.decode if llm.engine.graphs is not None else None
    points = []
    for batch in GRID_BATCHES:
        if runner is None or batch > max(runner.sizes):
            continue
        for context in GRID_CONTEXTS:
            points.append({"batch": batch, "context": context, "ms": graph_replay_ms(llm, batch, context)})
    return points


def workload_budget(model: str, page_size: int, requests: int | None, device: str | None, grid: bool,
                    out: Path) -> dict:
    """The nano-vllm workload (the one ``minisgl bench --workload nanovllm`` runs) on an engine with CUDA graphs
    and overlap: its wall time without and with step records, every step, the floor and its ceilings, and on
    CUDA the decode graph's device time over a grid of batch sizes and contexts and the sampler's time."""
    llm = LLM(model, page_size=page_size, max_running_req=256, max_seq_len=4096, device=device)
    try:
        cfg = llm.engine.model_config
        workload = make_workload(workload_spec("nanovllm"), cfg.vocab_size, 0, requests, 4096)
        warm_up(llm, workload)
        wall, tokens, _ = timed_workload(llm, workload, record=False)
        wall_recorded, _, steps = timed_workload(llm, workload, record=True)
        ceilings = measure_ceilings(llm.device, llm.engine.dtype)
        costs = ModelCosts.of(cfg, llm.engine.dtype.itemsize, llm.engine.kv_bytes_per_token)
        floor = workload_floor(costs, workload.requests, ceilings)
        cuda = llm.device.type == "cuda"
        runner = llm.engine.graphs.decode if llm.engine.graphs is not None else None
        result = {
            "model": model, "page_size": page_size, "requests": len(workload.requests), "tokens": tokens,
            "wall_s": wall, "wall_recorded_s": wall_recorded, "steps": steps,
            "copy_gbps": ceilings.copy_gbps, "matmul_gflops": ceilings.matmul_gflops,
            "costs": {"weight_bytes": costs.weight_bytes, "kv_bytes_per_token": costs.kv_bytes_per_token,
                      "flops_per_token": costs.flops_per_token, "attn_flops_per_pair": costs.attn_flops_per_pair},
            "floor": floor.to_dict(), "graph_sizes": list(runner.sizes) if runner is not None else [],
            "grid": [], "sampler_ms": {},
        }
        (out / f"workload_page{page_size}.json").write_text(json.dumps(result))  # kept if the grid is cut short
        if cuda and grid:
            result["sampler_ms"] = {b: sampler_ms(llm, b)["temperature"] for b in SAMPLER_BATCHES}
            result["grid"] = replay_grid(llm)
            (out / f"workload_page{page_size}.json").write_text(json.dumps(result))
        if cuda and grid:
            table = graph_kernel_table(llm, 256, 900, out / "graph_kernels_bs256.txt")
            result["graph_kernels_bs256"] = table
        return result
    finally:
        llm.close()


def _interpolate(points: dict[int, float], batch: int) -> float:
    """Linear in the batch size between the measured batches (flat beyond the ends)."""
    sizes = sorted(points)
    if batch <= sizes[0]:
        return points[sizes[0]]
    for low, high in zip(sizes, sizes[1:]):
        if batch <= high:
            return points[low] + (points[high] - points[low]) * (batch - low) / (high - low)
    return points[sizes[-1]]


def _padded(sizes: list[int], batch: int) -> int:
    return next((s for s in sizes if s >= batch), batch)


def decode_device_model(budget: dict) -> tuple[dict[int, float], dict[int, float]] | None:
    """From the replay grid: per batch size, the device ms of a replay with no context (weights, GEMMs, norms,
    the LM head) and its ms per cached token read (attention), from the two contexts' replays."""
    by_batch: dict[int, dict[int, float]] = {}
    for point in budget["grid"]:
        by_batch.setdefault(point["batch"], {})[point["context"]] = point["ms"]
    fixed, per_token = {}, {}
    for batch, times in by_batch.items():
        if len(times) < 2:
            continue
        (c0, t0), (c1, t1) = sorted(times.items())[:2]
        # the replay planned by graph_replay_ms is for contexts of c + 3 tokens per row
        slope = (t1 - t0) / (batch * (c1 - c0))
        per_token[batch] = max(slope, 0.0)
        fixed[batch] = t0 - per_token[batch] * batch * (c0 + 3)
    return (fixed, per_token) if fixed else None


def budget_rows(budget: dict) -> list[dict]:
    """The workload's steps in rows (prefill; decode by batch size), each with its count, its measured time
    (time between results: the rows sum to the recorded run's wall time, less what came before the first
    result), the same steps' floor, and on CUDA what the decode graph's device time, the sampler and the rest
    (host work the overlap did not hide, launches, copies) take of it."""
    bandwidth = budget["copy_gbps"] * 1e9
    rate = budget["matmul_gflops"] * 1e9
    costs = budget["costs"]
    model = decode_device_model(budget)
    sampler = {int(b): ms for b, ms in budget["sampler_ms"].items()}
    sizes = budget["graph_sizes"]
    rows = []
    prefill = [s for s in budget["steps"] if s["phase"] == "prefill"]
    rows.append({"name": "prefill", "steps": len(prefill), "s": sum(s["s"] for s in prefill),
                 "floor_s": sum(max((s["tokens"] * costs["flops_per_token"] + s["pairs"] * costs["attn_flops_per_pair"])
                                    / rate, costs["weight_bytes"] / bandwidth) for s in prefill)})
    last_prefill = max((i for i, s in enumerate(budget["steps"]) if s["phase"] == "prefill"), default=-1)
    for low, high in BINS:
        for during in (True, False):
            chosen = [s for i, s in enumerate(budget["steps"]) if s["phase"] == "decode"
                      and low <= s["batch"] <= high and (i < last_prefill) == during]
            if not chosen:
                continue
            row = {"name": f"decode {low}-{high}" + (" (between prefills)" if during else ""), "steps": len(chosen),
                   "s": sum(s["s"] for s in chosen),
                   "floor_kv_s": sum(s["context"] * costs["kv_bytes_per_token"] for s in chosen) / bandwidth,
                   "floor_weights_s": len(chosen) * costs["weight_bytes"] / bandwidth}
            row["floor_s"] = row["floor_kv_s"] + row["floor_weights_s"]
            if model is not None:
                fixed, per_token = model
                padded = [_padded(sizes, s["batch"]) for s in chosen]
                row["device_fixed_s"] = sum(_interpolate(fixed, p) for p in padded) / 1e3
                row["device_attention_s"] = sum(_interpolate(per_token, p) * s["context"]
                                                for p, s in zip(padded, chosen)) / 1e3
                row["sampler_s"] = sum(_interpolate(sampler, p) for p in padded) / 1e3 if sampler else 0.0
                row["rest_s"] = row["s"] - row["device_fixed_s"] - row["device_attention_s"] - row["sampler_s"]
            rows.append(row)
    return rows


def budget_lines(budget: dict) -> list[str]:
    floor = budget["floor"]
    steps_s = sum(s["s"] for s in budget["steps"])
    lines = [f"workload {budget['model']} page {budget['page_size']}: {budget['tokens']} tokens in "
             f"{budget['wall_s']:.3f} s ({budget['tokens'] / budget['wall_s']:.0f} tok/s); with step records "
             f"{budget['wall_recorded_s']:.3f} s, steps {steps_s:.3f} s over {len(budget['steps'])} steps",
             f"  ceilings: copy {budget['copy_gbps']:.0f} GB/s, matmul {budget['matmul_gflops'] / 1e3:.0f} TFLOP/s; "
             f"floor {floor['floor_s']:.3f} s (prefill {floor['prefill_s']:.3f}, decode {floor['decode_s']:.3f} over "
             f"{floor['decode_steps']} steps: KV {floor['kv_read_gb']:.0f} GB, weights {floor['weight_read_gb']:.0f} GB)"]
    for row in budget_rows(budget):
        text = f"  {row['name']}: {row['steps']} steps, {row['s']:.3f} s, floor {row['floor_s']:.3f} s"
        if "floor_kv_s" in row:
            text += f" (KV {row['floor_kv_s']:.3f}, weights {row['floor_weights_s']:.3f})"
        if "device_fixed_s" in row:
            text += (f"; graph device: fixed {row['device_fixed_s']:.3f} s, attention {row['device_attention_s']:.3f} s;"
                     f" sampler {row['sampler_s']:.3f} s; rest {row['rest_s']:.3f} s")
        lines.append(text)
    for point in budget["grid"]:
        lines.append(f"  graph replay batch {point['batch']} context {point['context']}: {point['ms']:.3f} ms")
    for batch, ms in budget["sampler_ms"].items():
        lines.append(f"  sampler, temperature, batch {batch}: {ms:.3f} ms")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "out" / "profile"))
    parser.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                        help=f"comma-separated, from: {', '.join(SECTIONS)}")
    parser.add_argument("--model", default=MODEL, help="the workload section's model")
    parser.add_argument("--requests", type=int, help="the workload section's requests (default: the workload's)")
    parser.add_argument("--page-sizes", default="16,1", help="the workload section's page sizes, comma-separated")
    parser.add_argument("--device", default=None, help="the workload section's device (default: the engine's)")
    parser.add_argument("--no-grid", action="store_true",
                        help="the workload section without the decode graph's replay grid, the sampler and the "
                             "kernel table (the steps' wall times only, a minute less)")
    parser.add_argument("--graph-batches", default=[1], type=lambda text: [int(b) for b in text.split(",")],
                        help="the graph_kernels section's batch sizes, comma-separated (default 1)")
    parser.add_argument("--graph-context", type=int, default=300, help="the graph_kernels section's context")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    unknown = sections - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}; use some of {', '.join(SECTIONS)}")
    try:
        page_sizes = [int(p) for p in args.page_sizes.split(",")]
    except ValueError:
        parser.error(f"--page-sizes takes integers separated by commas, got {args.page_sizes!r}")
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
            for batch in args.graph_batches:
                table = graph_kernel_table(llm, batch, args.graph_context, out / f"graph_kernels_bs{batch}.txt")
                say(f"==== kernels in 10 replays of the batch-{batch} decode graph, context {args.graph_context}"
                    f"\n{table}")
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

    if "prefill" in sections:
        for line in prefill_lines(out / "prefill_kernels.txt"):
            say(line)
        torch.cuda.empty_cache()

    if "pdl" in sections:
        for line in dependent_launch_lines():
            say(line)

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
    if "workload" in sections:
        for page_size in page_sizes:
            budget = workload_budget(args.model, page_size, args.requests, args.device,
                                     grid=page_size == page_sizes[0] and not args.no_grid, out=out)
            (out / f"workload_page{page_size}.json").write_text(json.dumps(budget))
            for line in budget_lines(budget):
                say(line)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    (out / "profile.txt").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
