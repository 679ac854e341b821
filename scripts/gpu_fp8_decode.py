"""Decode attention at the benchmark's shape on CUDA: the Triton paged kernel on fp8 and on bf16 pages
against flashinfer's bf16 decode. Batch 256, 16 query / 8 KV heads, head dim 128, page 16, contexts 600,
1100 and 1600; device time per layer from CUDA events over replays of a CUDA graph, and the KV bytes read
over that time. Prints one line per case; ``--json PATH`` writes them too.

    python3 scripts/gpu_fp8_decode.py [--sweep] [--bf16] [--batches 256,192] [--contexts 600,1100,1600] [--json F]
    python3 scripts/gpu_fp8_decode.py --all-heads [--contexts 600,1100] [--json out.json]
    python3 scripts/gpu_fp8_decode.py --variants [--contexts 600,1100] [--batches 256,64]

``--all-heads`` times the paged kernel's all-heads variant on fp8 pages (``DecodeTile.all_heads``) against
the default fp8 tile and flashinfer's bf16 decode, at 256 and 64 rows: a sweep of its tiles, each checked
against the default tile's output first (the run stops if one is off), and the best tile per case.

``--variants`` times builds of the CUDA fp8 decode with its choices turned off one by one (``VARIANTS``)
against the default build, in alternating rounds, each checked against the default build's output first.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import torch

from core.attention.flashinfer_backend import paged_splits
from core.kernels.paged_decode import TILES, DecodeTile, SplitBuffers, paged_decode
from core.kvcache.pool import KVPool

BATCH, HEADS, KV_HEADS, DIM, PAGE = 256, 16, 8, 128, 16
DEVICE = "cuda"


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
    device = torch.device(DEVICE)
    pages_per = -(-context // PAGE)
    order = torch.randperm(batch * pages_per, device=device).to(torch.int32)
    indptr = torch.arange(0, batch + 1, dtype=torch.int32, device=device) * pages_per
    last = torch.full((batch,), context - (pages_per - 1) * PAGE, dtype=torch.int32, device=device)
    q = torch.randn(batch, HEADS, DIM, device=device, dtype=torch.bfloat16)
    return batch * pages_per + 1, indptr, order, last, q


def filled_pool(num_pages: int, fp8: bool) -> KVPool:
    """A one-layer pool of random bf16 keys and values (stored as fp8 with ``fp8``)."""
    device = torch.device(DEVICE)
    pool = KVPool(1, num_pages, PAGE, KV_HEADS, DIM, torch.bfloat16, device, fp8=fp8)
    slots = torch.arange(pool.num_slots, device=device)
    for chunk in slots.split(1 << 20):
        pool.store(0, chunk, torch.randn(len(chunk), KV_HEADS, DIM, device=device, dtype=torch.bfloat16),
                   torch.randn(len(chunk), KV_HEADS, DIM, device=device, dtype=torch.bfloat16))
    return pool


def case(context: int, batch: int = BATCH, kv_kinds: tuple[bool, ...] = (True, False)) -> list[dict]:
    num_pages, indptr, order, last, q = layout(batch, context)
    rows = []
    for fp8 in kv_kinds:
        pool = filled_pool(num_pages, fp8)
        out = torch.empty_like(q)
        seconds = timed(lambda: paged_decode(q, pool, 0, indptr, order, last, DIM ** -0.5, out))
        kv_bytes = batch * context * KVPool.bytes_per_token(1, KV_HEADS, DIM, torch.bfloat16, fp8)
        rows.append({"kernel": f"triton {'fp8' if fp8 else 'bf16'}", "batch": batch, "context": context,
                     "us": seconds * 1e6, "tb_s": kv_bytes / seconds / 1e12})
        if fp8:
            rows += _cuda(q, pool, indptr, order, last, context, out)
        rows += _flashinfer(q, pool, indptr, order, last, context)
        del pool
        torch.cuda.empty_cache()
    return [r for r in rows if r]


def _cuda(q, pool, indptr, indices, last, context, triton_out) -> list[dict]:
    """The CUDA fp8 decode (core/kernels/fp8_decode_cuda.py) on the same pages, at 1, 2 and 4 splits, each
    checked against the Triton kernel's output first."""
    from core.kernels.fp8_decode_cuda import fp8_decode_cuda, unavailable_reason

    reason = unavailable_reason(q.device)
    if reason:
        print(f"cuda fp8: {reason}")
        return []
    kv_bytes = q.shape[0] * context * KVPool.bytes_per_token(1, KV_HEADS, DIM, torch.bfloat16, True)
    rows = []
    for splits in (1, 2, 4):
        out = torch.empty_like(q)
        fp8_decode_cuda(q, pool, 0, indptr, indices, last, DIM ** -0.5, out, splits)
        error = (out.float() - triton_out.float()).abs().max().item()
        seconds = timed(lambda: fp8_decode_cuda(q, pool, 0, indptr, indices, last, DIM ** -0.5, out, splits))
        rows.append({"kernel": f"cuda fp8 splits {splits}", "batch": q.shape[0], "context": context,
                     "us": seconds * 1e6, "tb_s": kv_bytes / seconds / 1e12, "max_diff_to_triton": error})
    return rows


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
    kv_bytes = q.shape[0] * context * KVPool.bytes_per_token(1, KV_HEADS, DIM, torch.bfloat16, pool.fp8)
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
        rows.append({"kernel": name, "batch": q.shape[0], "context": context, "us": seconds * 1e6,
                     "tb_s": kv_bytes / seconds / 1e12})
    return rows


# builds of the CUDA fp8 decode: the defaults, then each of fp8_decode.cu's choices turned off
VARIANTS = {"default": (), "no L2 prefetch": ("MINISGL_FP8_PREFETCH_L2=0",),
            "request-major, no L2 prefetch": ("MINISGL_FP8_HEAD_MAJOR=0", "MINISGL_FP8_PREFETCH_L2=0")}
VARIANT_ROUNDS = 3


def variants_case(context: int, batch: int) -> list[dict]:
    """The CUDA fp8 decode's builds (``VARIANTS``) on the same pages, one split, ``VARIANT_ROUNDS`` rounds in
    turn; each build's output checked against the default build's first (the run stops if one is off)."""
    from core.kernels.fp8_decode_cuda import fp8_decode_cuda, load_library

    major, minor = torch.cuda.get_device_capability()
    libraries = {}
    for name, defines in VARIANTS.items():
        built = load_library(f"{major}{minor}", defines)
        if built.library is None:
            sys.exit(f"gpu_fp8_decode.py: the {name!r} build failed: {built.reason}")
        libraries[name] = built.library
    num_pages, indptr, order, last, q = layout(batch, context)
    pool = filled_pool(num_pages, fp8=True)
    kv_bytes = batch * context * KVPool.bytes_per_token(1, KV_HEADS, DIM, torch.bfloat16, True)
    outs = {name: torch.empty_like(q) for name in VARIANTS}

    def run(name):
        return fp8_decode_cuda(q, pool, 0, indptr, order, last, DIM ** -0.5, outs[name], library=libraries[name])

    for name in VARIANTS:
        run(name)
        diff = (outs[name].float() - outs["default"].float()).abs().max().item()
        if not diff <= 1e-6:
            sys.exit(f"gpu_fp8_decode.py: the {name!r} build differs from the default one by {diff}")
    times = {name: [] for name in VARIANTS}
    for _ in range(VARIANT_ROUNDS):
        for name in VARIANTS:
            times[name].append(timed(lambda: run(name)))
    rows = []
    for name, seconds in times.items():
        best = min(seconds)
        rows.append({"kernel": f"cuda fp8 {name}", "batch": batch, "context": context, "us": best * 1e6,
                     "tb_s": kv_bytes / best / 1e12, "rounds_us": [round(t * 1e6, 1) for t in seconds]})
        print(f"VARIANT rows {batch} context {context} {name:<34}: {best * 1e6:7.1f} us ({rows[-1]['tb_s']:.2f} TB/s"
              f" of KV; rounds {', '.join(f'{t * 1e6:.1f}' for t in seconds)})", flush=True)
    del pool
    torch.cuda.empty_cache()
    return rows


def sweep(context: int = 1100, batch: int = BATCH) -> list[dict]:
    """The paged kernel's tile choices at one context, fp8 and bf16 pages: tokens per iteration, warps,
    pipeline stages, splits, float16 products for fp8."""
    device = torch.device(DEVICE)
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


# the all-heads sweep: tokens per iteration, warps, pipeline stages, splits per request by rows; the products
# per KV head (head_dots) without the tiles that spill registers compiled for sm_90 (64 tokens; 32 on 4 warps)
ALL_HEADS_SPLITS = {BATCH: (1, 2), 64: (1, 2, 4)}
BLOCK_DIAGONAL_TILES = list(itertools.product((16, 32, 64), (4, 8), (2, 3)))
HEAD_DOTS_TILES = [(16, 4, 2), (16, 4, 3), (16, 8, 2), (16, 8, 3), (32, 8, 2), (32, 8, 3)]
MATCH_TOLERANCE = 2e-2  # bf16 outputs of float16 products, as tests/gpu/test_paged_decode.py bounds them


def all_heads_tiles(splits: tuple[int, ...]) -> list[DecodeTile]:
    return [DecodeTile(tokens, warps, stages, n, f16=True, all_heads=True, head_dots=head_dots)
            for head_dots, shapes in ((False, BLOCK_DIAGONAL_TILES), (True, HEAD_DOTS_TILES))
            for (tokens, warps, stages), n in itertools.product(shapes, splits)]


def describe(tile: DecodeTile) -> str:
    products = "head dots" if tile.head_dots else "block-diagonal"
    return f"{products} tokens {tile.tokens} warps {tile.warps} stages {tile.stages} splits {tile.splits}"


def checked_tiles(q, pool, indptr, indices, last, buffers, tiles, batch, context) -> list[DecodeTile]:
    """The tiles that compile, each of whose output matches the default fp8 tile's (the per-head kernel):
    prints the largest difference, and stops the run if any tile is off."""
    want = paged_decode(q, pool, 0, indptr, indices, last, DIM ** -0.5, tile=TILES[True]).float()
    kept, worst, off = [], (-1.0, None), []
    for tile in tiles:
        try:
            got = paged_decode(q, pool, 0, indptr, indices, last, DIM ** -0.5, tile=tile, split_buffers=buffers)
            torch.cuda.synchronize()
        except Exception as exc:  # a tile that does not fit in shared memory or registers
            print(f"  rows {batch} {describe(tile)}: not run ({type(exc).__name__}: {str(exc)[:120]})", flush=True)
            continue
        diff = (got.float() - want).abs().max().item()
        if not diff <= MATCH_TOLERANCE:  # NaN too
            off.append((describe(tile), diff))
        worst = max(worst, (diff, describe(tile)), key=lambda w: w[0])
        kept.append(tile)
    print(f"CHECK rows {batch} context {context}: {len(kept)} all-heads tiles against the default fp8 tile, "
          f"max abs diff {worst[0]:.3e} ({worst[1]})", flush=True)
    if off or not kept:
        print(f"FAIL: all-heads output differs from the default fp8 tile's by more than {MATCH_TOLERANCE}: {off}"
              if off else "FAIL: no all-heads tile ran", flush=True)
        sys.exit(1)
    return kept


def all_heads_case(batch: int, context: int) -> list[dict]:
    """At ``batch`` rows of ``context`` tokens: the default fp8 tile, flashinfer's bf16 decode and every
    all-heads tile that matches the default's output, each timed; prints the best all-heads tile."""
    device = torch.device(DEVICE)
    num_pages, indptr, order, last, q = layout(batch, context)
    pool = filled_pool(num_pages, fp8=True)
    buffers = SplitBuffers.make(batch, HEADS, KV_HEADS, DIM, max(ALL_HEADS_SPLITS[batch]), device)
    tiles = checked_tiles(q, pool, indptr, order, last, buffers, all_heads_tiles(ALL_HEADS_SPLITS[batch]), batch,
                          context)
    kv_bytes = batch * context * KVPool.bytes_per_token(1, KV_HEADS, DIM, torch.bfloat16, fp8=True)
    out = torch.empty_like(q)
    rows = []
    for name, tile in [("triton fp8 default tile (per head)", TILES[True])] + [(f"all-heads {describe(t)}", t)
                                                                            for t in tiles]:
        seconds = timed(lambda: paged_decode(q, pool, 0, indptr, order, last, DIM ** -0.5, out, tile, buffers))
        rows.append({"kernel": name, "batch": batch, "context": context, "us": seconds * 1e6,
                     "tb_s": kv_bytes / seconds / 1e12})
        print(f"  rows {batch} context {context} {name}: {rows[-1]['us']:.1f} us, {rows[-1]['tb_s']:.2f} TB/s",
              flush=True)
    del pool
    torch.cuda.empty_cache()
    bf16 = filled_pool(num_pages, fp8=False)
    for row in _flashinfer(q, bf16, indptr, order, last, context):
        rows.append(row)
        print(f"  rows {batch} context {context} {row['kernel']}: {row['us']:.1f} us, {row['tb_s']:.2f} TB/s "
              f"(bf16 bytes)", flush=True)
    del bf16
    torch.cuda.empty_cache()
    print(best_line(rows), flush=True)
    return rows


def best_line(rows: list[dict]) -> str:
    """The best all-heads tile of one case against the default fp8 tile and the best flashinfer bf16."""
    best = min((r for r in rows if r["kernel"].startswith("all-heads")), key=lambda r: r["us"])
    default = next(r for r in rows if r["kernel"].startswith("triton fp8 default"))
    line = (f"BEST all-heads rows {best['batch']} context {best['context']}: {best['kernel'][10:]}: "
            f"{best['us']:.1f} us, {best['tb_s']:.2f} TB/s; default fp8 tile {default['us']:.1f} us "
            f"({default['us'] / best['us']:.2f}x)")
    flashinfer = [r for r in rows if r["kernel"].startswith("flashinfer bf16")]
    if flashinfer:
        fastest = min(flashinfer, key=lambda r: r["us"])
        line += f"; {fastest['kernel']} {fastest['us']:.1f} us ({fastest['us'] / best['us']:.2f}x)"
    return line + f"; the engine's rule would take splits {paged_splits(best['batch'], KV_HEADS, all_heads=True)}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--sweep", action="store_true", help="time the kernel's tile choices first")
    parser.add_argument("--all-heads", action="store_true",
                        help="the all-heads variant's sweep against the default fp8 tile and flashinfer bf16 only")
    parser.add_argument("--variants", action="store_true",
                        help="the CUDA fp8 decode's builds with its choices turned off, against the default build")
    parser.add_argument("--bf16", action="store_true", help="bf16 pages only (the Triton kernel, flashinfer's two)")
    parser.add_argument("--batches", default=str(BATCH), help="rows of the kernel-against-flashinfer cases")
    parser.add_argument("--contexts", default=None,
                        help="contexts of the kernel-against-flashinfer cases, comma-separated ('' for none; "
                             "default 600,1100,1600, with --all-heads 600,1100)")
    args = parser.parse_args()
    default_contexts = "600,1100" if args.all_heads else "600,1100,1600"
    contexts = [int(c) for c in (default_contexts if args.contexts is None else args.contexts).split(",") if c]
    if not torch.cuda.is_available():
        sys.exit("gpu_fp8_decode.py: needs a CUDA device (none found)")
    if args.all_heads:
        start = time.perf_counter()
        rows = [r for b in (BATCH, 64) for c in contexts for r in all_heads_case(b, c)]
        print(f"gpu_fp8_decode.py --all-heads: {len(rows)} timings in {time.perf_counter() - start:.0f} s "
              f"(compiles included)", file=sys.stderr, flush=True)
        print("\n".join(["SUMMARY"] + [best_line([r for r in rows if (r["batch"], r["context"]) == key])
                                        for key in dict.fromkeys((r["batch"], r["context"]) for r in rows)]))
        if args.json:
            json.dump(rows, open(args.json, "w"), indent=1)
        return
    if args.variants:
        rows = [r for c in contexts for b in (int(b) for b in args.batches.split(",")) for r in variants_case(c, b)]
        if args.json:
            json.dump(rows, open(args.json, "w"), indent=1)
        return
    rows = [r for b in (BATCH, 64) for r in sweep(1100, b)] if args.sweep else []
    for context, batch in itertools.product(contexts, [int(b) for b in args.batches.split(",")]):
        for row in case(context, batch, (False,) if args.bf16 else (True, False)):
            diff = f", max diff to triton {row['max_diff_to_triton']:.1e}" if "max_diff_to_triton" in row else ""
            print(f"{row['kernel']:<20} rows {row['batch']:>3} context {row['context']:>5}: "
                  f"{row['us']:8.1f} us per layer, {row['tb_s']:.2f} TB/s of KV{diff}", flush=True)
            rows.append(row)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
