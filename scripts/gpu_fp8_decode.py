"""Decode attention at the benchmark's shape on CUDA: the Triton paged kernel on fp8 and on bf16 pages
against flashinfer's bf16 decode. Batch 256, 16 query / 8 KV heads, head dim 128, page 16, contexts 600,
1100 and 1600; device time per layer from CUDA events over replays of a CUDA graph, and the KV bytes read
over that time. Prints one line per case; ``--json PATH`` writes them too.

    python3 scripts/gpu_fp8_decode.py [--sweep] [--contexts 600,1100,1600] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from core.kernels.paged_decode import DecodeTile, SplitBuffers, paged_decode
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


def layout(batch: int, context: int) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``batch`` requests of ``context`` tokens on pages scattered over the pool: (pages in the pool, the page
    lists' indptr, indices and last-page lengths, a random bf16 query)."""
    device = torch.device("cuda")
    pages_per = -(-context // PAGE)
    order = torch.randperm(batch * pages_per, device=device).to(torch.int32)
    indptr = torch.arange(0, batch + 1, dtype=torch.int32, device=device) * pages_per
    last = torch.full((batch,), context - (pages_per - 1) * PAGE, dtype=torch.int32, device=device)
    q = torch.randn(batch, HEADS, DIM, device=device, dtype=torch.bfloat16)
    return batch * pages_per + 1, indptr, order, last, q


def case(context: int) -> list[dict]:
    device = torch.device("cuda")
    num_pages, indptr, order, last, q = layout(BATCH, context)
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
        rows += _flashinfer(q, pool, indptr, order, last, context)
        del pool
        torch.cuda.empty_cache()
    return [r for r in rows if r]


def _flashinfer(q, pool, indptr, indices, last, context) -> list[dict]:
    """flashinfer's decode on the same pages (fp8 ones read with scale 1: the time, not the values), with and
    without its tensor-core (prefill-style) kernel."""
    try:
        import flashinfer
    except ImportError:
        return []
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device=q.device)
    shape = (-1, PAGE, KV_HEADS, DIM)
    kv = (pool.k[0].view(shape), pool.v[0].view(shape))
    kv_bytes = BATCH * context * KVPool.bytes_per_token(1, KV_HEADS, DIM, torch.bfloat16, pool.fp8)
    rows = []
    for tensor_cores in (True, False):
        try:
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
            wrapper.plan(indptr, indices, last, HEADS, KV_HEADS, DIM, PAGE, sm_scale=DIM ** -0.5,
                         q_data_type=torch.bfloat16, kv_data_type=pool.k.dtype)
            out = torch.empty_like(q)
            seconds = timed(lambda: wrapper.run(q, kv, out=out))
        except Exception as exc:
            print(f"flashinfer {pool.k.dtype} tensor cores {tensor_cores}: {type(exc).__name__}: {exc}"[:300])
            continue
        name = f"flashinfer {'fp8' if pool.fp8 else 'bf16'}{' tc' if tensor_cores else ''}"
        rows.append({"kernel": name, "context": context, "us": seconds * 1e6, "tb_s": kv_bytes / seconds / 1e12})
    return rows


def sweep(context: int = 1100, batch: int = BATCH) -> list[dict]:
    """The paged kernel's tile choices at one context, fp8 and bf16 pages: tokens per iteration, warps,
    pipeline stages, splits, float16 products for fp8."""
    device = torch.device("cuda")
    num_pages, indptr, order, last, q = layout(batch, context)
    rows = []
    for fp8 in (True, False):
        pool = KVPool(1, num_pages, PAGE, KV_HEADS, DIM, torch.bfloat16, device, fp8=fp8)
        out = torch.empty_like(q)
        buffers = SplitBuffers.make(batch, HEADS, KV_HEADS, DIM, 8, device)
        kv_bytes = batch * context * KVPool.bytes_per_token(1, KV_HEADS, DIM, torch.bfloat16, fp8)
        tiles = [DecodeTile(t, 4, s, 1, f16, max_registers=regs) for t in (64, 128) for s in (1, 2)
                 for f16 in ((False, True) if fp8 else (False,)) for regs in (None, 128, 168)]
        best = None
        for tile in tiles:
            try:
                seconds = timed(lambda: paged_decode(q, pool, 0, indptr, order, last, DIM ** -0.5, out, tile,
                                                     buffers))
            except Exception as exc:  # a tile that does not fit in shared memory
                print(f"batch {batch} tile {tile}: {type(exc).__name__}", flush=True)
                continue
            row = {"kernel": f"triton {'fp8' if fp8 else 'bf16'} {tile}", "batch": batch, "context": context,
                   "us": seconds * 1e6, "tb_s": kv_bytes / seconds / 1e12}
            rows.append(row)
            best = row if best is None or row["us"] < best["us"] else best
            print(f"batch {batch} context {context} {row['kernel']}: {row['us']:.1f} us, {row['tb_s']:.2f} TB/s",
                  flush=True)
        print(f"BEST batch {batch} context {context}: {best}", flush=True)
        rows += _flashinfer(q, pool, indptr, order, last, context) if batch == BATCH else []
        del pool
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--sweep", action="store_true", help="time the kernel's tile choices first")
    parser.add_argument("--contexts", default="600,1100,1600",
                        help="contexts of the kernel-against-flashinfer cases, comma-separated ('' for none)")
    args = parser.parse_args()
    rows = [r for b in (BATCH, 64) for r in sweep(1100, b)] if args.sweep else []
    for context in [int(c) for c in args.contexts.split(",") if c]:
        for row in case(context):
            print(f"{row['kernel']:<16} context {row['context']:>5}: {row['us']:8.1f} us per layer, "
                  f"{row['tb_s']:.2f} TB/s of KV", flush=True)
            rows.append(row)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
