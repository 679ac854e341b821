"""Decode attention at the benchmark's shape on CUDA: the Triton paged kernel on fp8 and on bf16 pages
against flashinfer's bf16 decode. Batch 256, 16 query / 8 KV heads, head dim 128, page 16, contexts 600,
1100 and 1600; device time per layer from CUDA events over replays of a CUDA graph, and the KV bytes read
over that time. Prints one line per case; ``--json PATH`` writes them too.

    python3 scripts/gpu_fp8_decode.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from core.kernels.paged_decode import paged_decode
from core.kvcache.pool import KVPool

BATCH, HEADS, KV_HEADS, DIM, PAGE = 256, 16, 8, 128, 16


def timed(fn, repeats: int = 20) -> float:
    """Seconds per call: one CUDA graph of ``repeats`` calls, replayed after a warm-up."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / (3 * repeats)


def case(context: int) -> list[dict]:
    device = torch.device("cuda")
    pages_per = -(-context // PAGE)
    num_pages = BATCH * pages_per + 1
    order = torch.randperm(BATCH * pages_per, device=device).to(torch.int32)
    indptr = torch.arange(0, BATCH + 1, dtype=torch.int32, device=device) * pages_per
    last = torch.full((BATCH,), context - (pages_per - 1) * PAGE, dtype=torch.int32, device=device)
    q = torch.randn(BATCH, HEADS, DIM, device=device, dtype=torch.bfloat16)
    rows = []
    for fp8 in (True, False):
        pool = KVPool(1, num_pages, PAGE, KV_HEADS, DIM, torch.bfloat16, device, fp8=fp8)
        slots = torch.arange(pool.num_slots, device=device)
        for chunk in slots.split(1 << 20):
            pool.store(0, chunk, torch.randn(len(chunk), KV_HEADS, DIM, device=device, dtype=torch.bfloat16),
                       torch.randn(len(chunk), KV_HEADS, DIM, device=device, dtype=torch.bfloat16))
        out = torch.empty_like(q)
        seconds = timed(lambda: paged_decode(q, pool, 0, indptr, order, last, DIM ** -0.5, out))
        kv_bytes = BATCH * context * KVPool.bytes_per_token(1, KV_HEADS, DIM, torch.bfloat16, fp8)
        rows.append({"kernel": f"triton {'fp8' if fp8 else 'bf16'}", "context": context, "us": seconds * 1e6,
                     "tb_s": kv_bytes / seconds / 1e12})
        if not fp8:
            rows.append(_flashinfer(q, pool, indptr, order, last, context))
        del pool
        torch.cuda.empty_cache()
    return [r for r in rows if r]


def _flashinfer(q, pool, indptr, indices, last, context) -> dict | None:
    try:
        import flashinfer
    except ImportError:
        return None
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    wrapper.plan(indptr, indices, last, HEADS, KV_HEADS, DIM, PAGE, sm_scale=DIM ** -0.5,
                 q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    shape = (-1, PAGE, KV_HEADS, DIM)
    kv = (pool.k[0].view(shape), pool.v[0].view(shape))
    out = torch.empty_like(q)
    seconds = timed(lambda: wrapper.run(q, kv, out=out))
    kv_bytes = BATCH * context * KVPool.bytes_per_token(1, KV_HEADS, DIM, torch.bfloat16)
    return {"kernel": "flashinfer bf16", "context": context, "us": seconds * 1e6, "tb_s": kv_bytes / seconds / 1e12}


def sweep(context: int = 1100) -> list[dict]:
    """The fp8 kernel's tile choices at one context: tokens per iteration, warps, pipeline stages."""
    device = torch.device("cuda")
    pages_per = -(-context // PAGE)
    order = torch.randperm(BATCH * pages_per, device=device).to(torch.int32)
    indptr = torch.arange(0, BATCH + 1, dtype=torch.int32, device=device) * pages_per
    last = torch.full((BATCH,), context - (pages_per - 1) * PAGE, dtype=torch.int32, device=device)
    q = torch.randn(BATCH, HEADS, DIM, device=device, dtype=torch.bfloat16)
    pool = KVPool(1, BATCH * pages_per + 1, PAGE, KV_HEADS, DIM, torch.bfloat16, device, fp8=True)
    out, rows = torch.empty_like(q), []
    kv_bytes = BATCH * context * KVPool.bytes_per_token(1, KV_HEADS, DIM, torch.bfloat16, True)
    for tile in [(t, w, s) for t in (64, 128, 256) for w in (4, 8) for s in (2, 3, 4)]:
        try:
            seconds = timed(lambda: paged_decode(q, pool, 0, indptr, order, last, DIM ** -0.5, out, tile))
        except Exception as exc:  # a tile that does not fit in shared memory
            print(f"tile {tile}: {type(exc).__name__}", flush=True)
            continue
        rows.append({"kernel": f"triton fp8 tile {tile}", "context": context, "us": seconds * 1e6,
                     "tb_s": kv_bytes / seconds / 1e12})
        print(f"tile {tile}: {seconds * 1e6:.1f} us, {rows[-1]['tb_s']:.2f} TB/s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--sweep", action="store_true", help="time the fp8 kernel's tile choices first")
    args = parser.parse_args()
    rows = sweep() if args.sweep else []
    for context in (600, 1100, 1600):
        for row in case(context):
            print(f"{row['kernel']:<16} context {row['context']:>5}: {row['us']:8.1f} us per layer, "
                  f"{row['tb_s']:.2f} TB/s of KV", flush=True)
            rows.append(row)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
