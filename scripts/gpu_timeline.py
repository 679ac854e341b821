"""Where the GPU waits during decode: a timeline of the engine's steps, and the idle gaps in it.

The graph-replay figures (scripts/gpu_profile.py) leave out whatever runs between replays: the sampler, the
copies of the next step's inputs, and any time the device waits for the host. This records a run of decode
steps at one batch size with torch.profiler (CUPTI's device timestamps of every kernel, copy and memset, also
inside CUDA graphs), writes the Chrome trace, and prints how the span splits into kernels, copies and idle
time, and the longest gaps with the activity that ended each one.

    python3 scripts/gpu_timeline.py run --batch 256 --context 600 --tokens 24 --trace $OUT/tl.json
    python3 scripts/gpu_timeline.py analyze $OUT/tl.json

``workload`` records nano-vllm's whole workload (the one ``minisgl bench --workload nanovllm`` times) the same way,
and ``analyze --budget`` splits it into steps and sums, per kind of step (prefill, decode by its row count), the
device's busy time by kernel family and the time it sat idle: where a run's seconds go, on the device's clock.

    python3 scripts/gpu_timeline.py workload --trace $OUT/wl.json
    python3 scripts/gpu_timeline.py analyze $OUT/wl.json --budget

``--steps`` splits the timeline at each copy of the sampled tokens to the host (one per step) and prints a
typical step activity by activity: what the device runs between two steps' graphs, and where it waits.

    python3 scripts/gpu_timeline.py run --batch 1 --context 300 --tokens 200 --temperature 0 --device-only \
        --trace $OUT/tl1.json
    python3 scripts/gpu_timeline.py analyze $OUT/tl1.json --steps
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import statistics
from collections import Counter

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def run(args: argparse.Namespace) -> None:
    import torch

    from core import LLM, SamplingParams

    llm = LLM(args.model, page_size=args.page_size, max_running_req=max(args.batch, 8), max_seq_len=4096,
              kv_dtype=args.kv_dtype, log=print)
    rng = random.Random(0)
    prompts = [[rng.randrange(10000) for _ in range(args.context)] for _ in range(args.batch)]
    # the same prompts once before: the timed run finds them in the prefix cache, so its prefill is one token
    # per request and the timeline is the decode steps
    llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    from torch.profiler import ProfilerActivity, profile

    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=args.temperature)
    torch.cuda.synchronize()
    # CUDA activity alone leaves the host's speed as it is: its idle share is then the engine's
    activities = [ProfilerActivity.CUDA] if args.device_only else [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        llm.generate(prompts, params)
        torch.cuda.synchronize()
    prof.export_chrome_trace(args.trace)
    llm.close()


def workload(args: argparse.Namespace) -> None:
    """The nano-vllm workload once to warm up (every prefill shape, every graph), then once under the profiler."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from core import LLM
    from core.bench.engine_run import sampling_params, warm_up
    from core.bench.workload import make_workload, workload_spec

    llm = LLM(args.model, page_size=args.page_size, max_running_req=256, max_seq_len=4096, kv_dtype=args.kv_dtype,
              log=print)
    work = make_workload(workload_spec("nanovllm"), llm.engine.model_config.vocab_size, 0, None, 4096)
    warm_up(llm, work)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        outputs = llm.generate([r.prompt_ids for r in work.requests], sampling_params(work))
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    tokens = sum(len(o["token_ids"]) for o in outputs)
    print(f"workload under the profiler: {tokens} tokens in {wall:.2f} s ({tokens / wall:,.0f} tok/s)")
    prof.export_chrome_trace(args.trace)
    llm.close()


def device_events(trace: dict) -> list[tuple[float, float, str, int]]:
    """(start ns, end ns, name, bytes) of every kernel, copy and memset, in start order."""
    events = [(e["ts"] * 1e3, (e["ts"] + e.get("dur", 0)) * 1e3, e["name"], int(e.get("args", {}).get("bytes", 0)))
              for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]
    events.sort()
    return events


# kernel families by a piece of their name, first match wins (flashinfer's, cuBLAS's, ours in Triton, torch's)
FAMILIES = (
    ("attention: prefill", ("Prefill",)),
    ("attention: decode", ("Decode", "decode_attention", "paged_decode", "merge", "Merge", "finish_split")),
    ("GEMM", ("gemm", "nvjet", "cutlass", "xmma", "splitKreduce", "gemv")),
    ("add+RMSNorm, RMSNorm", ("RMSNorm", "rms_norm", "rmsnorm")),
    ("SiLU-and-mul", ("act_and_mul", "silu")),
    ("QK-norm/RoPE/KV store", ("fused_qkv", "rope", "Rope")),
    ("sampler", ("race", "screen", "argmax", "sampl")),
    ("copies and memsets", ("Memcpy", "Memset", "memcpy", "memset")),
)


def family(name: str) -> str:
    for label, pieces in FAMILIES:
        if any(piece in name for piece in pieces):
            return label
    return "other (torch's own kernels)"


def split_steps(events: list) -> list[list]:
    """The timeline cut after each copy of sampled tokens to the host: one piece per engine step."""
    steps, current = [], []
    for event in events:
        current.append(event)
        if is_token_copy(event[2]):
            steps.append(current)
            current = []
    if current:
        steps.append(current)
    return steps


# a prefill chunk's layer GEMMs run over thousands of rows (an 8,192-token chunk's QKV about 90 us on an H200); a
# decode step's take a few microseconds, its LM head about 120 at 256 rows. Kernel names cannot tell the two apart:
# flashinfer's tensor-core decode is its prefill kernel.
LONG_GEMM_NS, PREFILL_LONG_GEMMS = 40_000, 8


def step_kind(step: list) -> str:
    long_gemms = sum(1 for start, end, name, _ in step if family(name) == "GEMM" and end - start >= LONG_GEMM_NS)
    if long_gemms >= PREFILL_LONG_GEMMS:
        return "prefill"
    return decode_kind(max((b for _, _, name, b in step if is_token_copy(name)), default=0) // 8)  # int64 tokens


def decode_kind(rows: int) -> str:
    """A decode step's group by its row count, as the budget's lines name them."""
    for low, high in ((1, 1), (2, 32), (33, 128), (129, 255), (256, 256)):
        if rows <= high:
            return f"decode {low}-{high} rows" if low < high else f"decode {low} rows"
    return f"decode {rows} rows"


def budget(events: list) -> None:
    """Per kind of step: steps, the device span from the previous step's token copy to this one's, its busy
    time by kernel family, and its idle time (waiting for the host between kernels)."""
    rows: dict[str, dict] = {}
    previous_end = events[0][0]
    for step in split_steps(events):
        name_of_kind = step_kind(step)
        kind = rows.setdefault(name_of_kind, {"steps": 0, "span": 0.0, "idle": 0.0, "busy": Counter()})
        kind["steps"] += 1
        kind["span"] += step[-1][1] - previous_end
        cursor = previous_end
        for start, end, name, _ in step:
            kind["idle"] += max(start - cursor, 0.0)
            label = family(name)
            if label == "attention: prefill" and name_of_kind != "prefill":  # the tensor-core decode
                label = "attention: decode"
            kind["busy"][label] += max(end - max(start, cursor), 0.0)  # overlapping streams count once
            cursor = max(cursor, end)
        previous_end = cursor
    total = sum(k["span"] for k in rows.values())
    print(f"\nthe run by kind of step: {total / 1e9:.3f} s on the device's clock")
    labels = [label for label, _ in FAMILIES] + ["other (torch's own kernels)"]
    for kind, k in sorted(rows.items(), key=lambda kv: -kv[1]["span"]):
        print(f"  {kind}: {k['steps']} steps, {k['span'] / 1e9:.3f} s ({k['span'] / max(k['steps'], 1) / 1e3:.0f} us "
              f"a step), idle {k['idle'] / 1e9:.3f} s")
        for label in labels:
            if k["busy"][label]:
                print(f"      {k['busy'][label] / 1e9:8.3f} s  {label}")


def analyze(args: argparse.Namespace) -> None:
    events = device_events(json.load(open(args.trace)))
    if args.budget and events:
        budget(events)
    events = [(start, end, name) for start, end, name, _ in events]
    if not events:
        sys.exit("no kernels in the file")
    first = events[0][0] + args.skip_ms * 1e6
    events = [e for e in events if e[0] >= first]
    span = events[-1][1] - events[0][0]
    busy, idle, gaps, cursor = Counter(), 0, [], events[0][0]
    for start, end, name in events:
        if start > cursor:
            gap = start - cursor
            idle += gap
            gaps.append((gap, name))
        busy[name] += end - start
        cursor = max(cursor, end)
    print(f"span {span / 1e6:.2f} ms, idle {idle / 1e6:.2f} ms ({100 * idle / span:.1f}%), "
          f"{len(events)} activities")
    for name, ns in busy.most_common(args.top):
        print(f"  {ns / 1e6:9.3f} ms  {100 * ns / span:5.1f}%  {name[:90]}")
    big = sorted(gaps, reverse=True)[:args.top]
    print("longest gaps (us) and the activity after each:")
    for gap, name in big:
        print(f"  {gap / 1e3:9.1f}  {name[:90]}")
    over = [g for g, _ in gaps if g > 20_000]
    print(f"gaps over 20 us: {len(over)}, {sum(over) / 1e6:.2f} ms in all")
    if args.steps:
        step_lines(events, args.top)


def is_token_copy(name: str) -> bool:
    return "DtoH" in name or "Device -> Pinned" in name


def step_lines(events: list[tuple[float, float, str]], top: int) -> None:
    """A typical step, activity by activity: median gap before it and median duration, over the steps that
    ran the most common sequence of activities (steps that also write a new page-table entry differ)."""
    steps = [step for step in split_steps(events) if is_token_copy(step[-1][2])]
    if len(steps) < 3:
        print("fewer than three token copies in the trace: not a decode timeline")
        return
    # each step with the one before it (the gap before a step's first activity is the device waiting for it);
    # the first step may have started before the profile did
    pairs = list(zip(steps[1:], steps[2:]))
    shapes = Counter(tuple(name for _, _, name in step) for _, step in pairs)
    shape, count = shapes.most_common(1)[0]
    same = [(prev, step) for prev, step in pairs if tuple(name for _, _, name in step) == shape]
    spans = [step[-1][1] - prev[-1][1] for prev, step in pairs]
    print(f"\n{len(pairs)} steps, median {statistics.median(spans) / 1e3:.1f} us from one token copy to the next; "
          f"{count} of them ran the same {len(shape)} activities:")
    names = Counter(shape)
    per_layer = max(names.values())
    rows, total_gap, total_busy = [], 0.0, 0.0
    for i, name in enumerate(shape):
        gap = statistics.median(step[i][0] - (step[i - 1][1] if i else prev[-1][1]) for prev, step in same)
        busy = statistics.median(step[i][1] - step[i][0] for _, step in same)
        total_gap, total_busy = total_gap + max(gap, 0.0), total_busy + busy
        rows.append((i, name, gap, busy))
    print(f"  busy {total_busy / 1e3:.1f} us, gaps {total_gap / 1e3:.1f} us (medians, activity by activity)")
    print("  activities that are not one of a layer's (seen fewer times than the most repeated one):")
    for i, name, gap, busy in rows:
        if names[name] < per_layer // 2:
            print(f"    #{i:4d}  gap {gap / 1e3:7.2f} us  busy {busy / 1e3:7.2f} us  {name[:80]}")
    print(f"  the {top} longest gaps inside the step:")
    for i, name, gap, busy in sorted(rows, key=lambda r: -r[2])[:top]:
        print(f"    #{i:4d}  gap {gap / 1e3:7.2f} us  busy {busy / 1e3:7.2f} us  {name[:80]}")
    layer = Counter()
    for i, name, gap, busy in rows:
        if names[name] >= per_layer // 2:
            layer[name] += busy
    print("  the layers' kernels, per step:")
    for name, ns in layer.most_common():
        print(f"    {ns / 1e3:8.1f} us  x{names[name]}  {name[:80]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="the engine's decode steps, profiled between cudaProfilerStart and Stop")
    r.add_argument("--model", default="random:qwen3-0.6b")
    r.add_argument("--batch", type=int, default=256)
    r.add_argument("--context", type=int, default=600)
    r.add_argument("--tokens", type=int, default=24)
    r.add_argument("--temperature", type=float, default=0.6)
    r.add_argument("--kv-dtype", default="auto")
    r.add_argument("--page-size", type=int, default=128, help="tokens a KV page (the peer harness's)")
    r.add_argument("--trace", default="timeline.json", help="where the Chrome trace goes")
    r.add_argument("--device-only", action="store_true", help="record CUDA activity only (the host runs at speed)")
    a = sub.add_parser("analyze", help="kernels, copies and idle gaps from the exported SQLite file")
    a.add_argument("trace")
    a.add_argument("--skip-ms", type=float, default=0.0, help="leave out the first milliseconds")
    a.add_argument("--top", type=int, default=15)
    a.add_argument("--steps", action="store_true", help="a typical decode step, activity by activity")
    a.add_argument("--budget", action="store_true", help="the whole run by kind of step and kernel family")
    w = sub.add_parser("workload", help="nano-vllm's workload, profiled whole (device activity only)")
    w.add_argument("--model", default="random:qwen3-0.6b")
    w.add_argument("--kv-dtype", default="auto")
    w.add_argument("--page-size", type=int, default=128, help="tokens a KV page (the peer harness's)")
    w.add_argument("--trace", default="workload.json", help="where the Chrome trace goes")
    args = parser.parse_args()
    {"run": run, "analyze": analyze, "workload": workload}[args.command](args)


if __name__ == "__main__":
    main()
