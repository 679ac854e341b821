"""Decode attention at the lengths nano-vllm's workload really has, on CUDA: flashinfer's plain and tensor-core
decode (planned as the engine plans them under CUDA graphs) against the Triton paged kernel on bf16 pages with
1 to 8 splits per (request, KV head).

The uniform-context tables (scripts/gpu_fp8_decode.py) give every request the same length, so a kernel that
hands each (request, KV head) to one program balances perfectly there. In the workload the running requests'
lengths spread over about 900 tokens: prompts of 100-1,024 ids plus the tokens decoded so far. This draws the
workload as nano-vllm does (seed 0), and for each batch size B takes the step at which B requests are still
decoding (all started together): their contexts are prompt length + that step. Device time per layer from CUDA
events over replays of a CUDA graph, and the KV bytes read over that time; each Triton case is checked against
flashinfer's output first.

The order of the requests in the batch may matter too: flashinfer's plans hand out work request by request (one
KV head after another), so a long request late in the batch could be a tail. ``--orders`` times each batch as
drawn, longest first and shortest first. ``--xqa`` adds flashinfer's XQA decode (TensorRT-LLM's kernel, through a
[batch, pages] page table), ``--hnd`` the three flashinfer decodes on an HND copy of the pages, ``--fa3`` the
batch prefill kernel of the Hopper backend (fa3: warp-specialised, its loads in producer warps) with one query per
request, which the tensor-core decode's plan never picks for bf16 (it takes fa2's). ``--holistic`` adds flashinfer's
persistent ``BatchAttention`` (a fixed grid of two blocks per SM, each working through a list of (request, KV head,
KV chunk) items its plan balanced by length on the host, the chunks merged inside the same kernel), on the same
pages in the layout of the last flashinfer row; its plan's host time is printed with it.

    python3 scripts/gpu_decode_mixed.py [--batches 32,64,...,256] [--splits 1,2,4,8] [--orders drawn,longest,shortest]
        [--xqa] [--hnd] [--fa3] [--holistic] [--page 16] [--json F]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Callable

import torch

from core.bench.workload import make_workload, workload_spec
from core.kernels.paged_decode import TILES, SplitBuffers, paged_decode
from core.kvcache.pool import KVPool
from gpu_fp8_decode import timed  # beside this script: Python puts a script's folder on its path

HEADS, KV_HEADS, DIM, PAGE = 16, 8, 128, 16
DEVICE = "cuda"
WORKSPACE_BYTES = 128 << 20
VOCAB = 151936  # Qwen3's: the ids do not matter here, only the lengths


def workload_lengths(seed: int = 0) -> tuple[list[int], list[int]]:
    """nano-vllm's workload as ``minisgl bench --workload nanovllm`` draws it: prompt lengths and max_tokens."""
    work = make_workload(workload_spec("nanovllm"), VOCAB, seed)
    return [len(r.prompt_ids) for r in work.requests], [r.max_tokens for r in work.requests]


def contexts_at(batch: int, prompt_lens: list[int], max_tokens: list[int]) -> list[int]:
    """The contexts of the ``batch`` requests still decoding at the last step where that many remain."""
    order = sorted(range(len(max_tokens)), key=lambda i: -max_tokens[i])[:batch]
    step = max_tokens[order[-1]] - 1
    return [prompt_lens[i] + step for i in order]


ORDERS = {
    "drawn": lambda contexts: list(contexts),
    "longest": lambda contexts: sorted(contexts, reverse=True),
    "shortest": lambda contexts: sorted(contexts),
}


def measured(kernel: str, run: Callable[[], object], out: torch.Tensor, reference: torch.Tensor | None,
             common: dict, kv_bytes: int) -> dict:
    """One row of the table: ``run`` once, its ``out`` checked against ``reference`` (None: this row is the
    reference), then timed; the KV bytes read over that time."""
    run()
    diff = 0.0 if reference is None else (out.float() - reference.float()).abs().max().item()
    seconds = timed(run)
    return {"kernel": kernel, **common, "us": seconds * 1e6, "tb_s": kv_bytes / seconds / 1e12, "max_diff": diff}


def xqa_row(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], indptr: torch.Tensor, indices: torch.Tensor,
            contexts: list[int], reference: torch.Tensor, common: dict, kv_bytes: int) -> dict:
    """flashinfer's XQA decode (TensorRT-LLM's kernel; one block per request and KV head from 17 rows, the heads
    of a request side by side) on the same pages, through a [batch, pages] page table."""
    from flashinfer.decode import xqa_batch_decode_with_kv_cache

    batch, width = len(contexts), max(-(-c // PAGE) for c in contexts)
    table = torch.zeros(batch, width, dtype=torch.int32)
    starts, pages = indptr.tolist(), indices.cpu()
    for i in range(batch):
        table[i, :starts[i + 1] - starts[i]] = pages[starts[i]:starts[i + 1]]
    table = table.to(q.device)
    seq_lens = torch.tensor(contexts, dtype=torch.int32, device=q.device)
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
    out = torch.empty_like(q)
    run = lambda: xqa_batch_decode_with_kv_cache(q, kv, workspace, table, seq_lens, width * PAGE,  # noqa: E731
                                                 bmm1_scale=DIM ** -0.5, out=out)
    return measured("xqa", run, out, reference, common, kv_bytes)


def fa3_row(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], indptr: torch.Tensor, indices: torch.Tensor,
            last: torch.Tensor, reference: torch.Tensor, common: dict, kv_bytes: int) -> dict:
    """flashinfer's fa3 batch prefill with one query per request, planned for CUDA graphs as the engine plans."""
    import flashinfer

    batch = q.shape[0]
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=qo_indptr.clone(), paged_kv_indptr_buf=indptr.clone(),
        paged_kv_indices_buf=indices.clone(), paged_kv_last_page_len_buf=last.clone(), backend="fa3")
    wrapper.plan(qo_indptr.cpu(), indptr.cpu(), indices.cpu(), last.cpu(), HEADS, KV_HEADS, DIM, PAGE,
                 causal=False, sm_scale=DIM ** -0.5, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    out = torch.empty_like(q)
    return measured("fa3", lambda: wrapper.run(q, kv, out=out), out, reference, common, kv_bytes)


def holistic_row(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], layout: str, indptr: torch.Tensor,
                 indices: torch.Tensor, contexts: list[int], reference: torch.Tensor, common: dict,
                 kv_bytes: int) -> dict:
    """flashinfer's persistent BatchAttention, one query a request; the row also says how long its plan took on
    the host (it balances the work there, at every step, where the engine's unsplit plan is made once a size)."""
    import time

    import flashinfer

    batch = q.shape[0]
    wrapper = flashinfer.BatchAttention(kv_layout=layout, device=str(q.device))
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
    kv_len = torch.tensor(contexts, dtype=torch.int32, device=q.device)
    plan = lambda: wrapper.plan(qo_indptr, indptr, indices, kv_len, HEADS, KV_HEADS, DIM, DIM, PAGE,  # noqa: E731
                                causal=False, sm_scale=DIM ** -0.5, q_data_type=torch.bfloat16,
                                kv_data_type=torch.bfloat16)
    plan()
    start = time.perf_counter()
    for _ in range(10):
        plan()
    plan_us = (time.perf_counter() - start) / 10 * 1e6
    out = torch.empty_like(q)
    lse = torch.empty(batch, HEADS, dtype=torch.float32, device=q.device)
    row = measured(f"holistic {layout}", lambda: wrapper.run(q, kv, out=out, lse=lse), out, reference, common,
                   kv_bytes)
    return {**row, "plan_us": plan_us}


def case(contexts: list[int], splits: list[int], xqa: bool = False, hnd: bool = False,
         fa3: bool = False, holistic: bool = False) -> list[dict]:
    device = torch.device(DEVICE)
    batch = len(contexts)
    pages = [-(-c // PAGE) for c in contexts]
    num_pages = sum(pages) + 1
    indices = torch.randperm(num_pages - 1, device=device).to(torch.int32)
    indptr = torch.tensor([0] + pages, dtype=torch.int32, device=device).cumsum(0).to(torch.int32)
    last = torch.tensor([c - (p - 1) * PAGE for c, p in zip(contexts, pages)], dtype=torch.int32, device=device)
    q = torch.randn(batch, HEADS, DIM, device=device, dtype=torch.bfloat16)
    pool = KVPool(1, num_pages, PAGE, KV_HEADS, DIM, torch.bfloat16, device)
    for chunk in torch.arange(pool.num_slots, device=device).split(1 << 20):
        pool.store(0, chunk, torch.randn(len(chunk), KV_HEADS, DIM, device=device, dtype=torch.bfloat16),
                   torch.randn(len(chunk), KV_HEADS, DIM, device=device, dtype=torch.bfloat16))
    kv_bytes = sum(contexts) * KVPool.bytes_per_token(1, KV_HEADS, DIM, torch.bfloat16, False)
    common = {"batch": batch, "mean_context": sum(contexts) / batch, "max_context": max(contexts)}
    rows, reference = [], None
    import flashinfer

    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    kv = (pool.k[0].view(-1, PAGE, KV_HEADS, DIM), pool.v[0].view(-1, PAGE, KV_HEADS, DIM))
    host = (indptr.cpu(), indices.cpu(), last.cpu())
    variants = [(False, False, "NHD"), (True, False, "NHD"), (True, True, "NHD")]
    variants += [(tc, unsplit, "HND") for tc, unsplit, _ in variants] if hnd else []
    for tensor_cores, unsplit, layout in variants:
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, layout, use_cuda_graph=True, use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=indptr.clone(), paged_kv_indices_buffer=indices.clone(),
            paged_kv_last_page_len_buffer=last.clone())
        extra = {"disable_split_kv": True} if unsplit else {}
        wrapper.plan(*host, HEADS, KV_HEADS, DIM, PAGE, sm_scale=DIM ** -0.5, q_data_type=torch.bfloat16,
                     kv_data_type=torch.bfloat16, **extra)
        # HND: each page's KV head contiguous, a copy of the same pages
        kv_pages = kv if layout == "NHD" else tuple(t.transpose(1, 2).contiguous() for t in kv)
        out = torch.empty_like(q)
        name = ("flashinfer" + (" tc" if tensor_cores else "") + (" unsplit" if unsplit else "")
                + (" HND" if layout == "HND" else ""))
        rows.append(measured(name, lambda: wrapper.run(q, kv_pages, out=out), out, reference, common, kv_bytes))
        if reference is None:
            reference = out.clone()
        last_pages = (kv_pages, layout)
    if holistic:
        try:
            rows.append(holistic_row(q, last_pages[0], last_pages[1], indptr, indices, contexts, reference, common,
                                     kv_bytes))
        except Exception as exc:
            print(f"holistic: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
    del last_pages
    if xqa:
        try:
            rows.append(xqa_row(q, kv, indptr, indices, contexts, reference, common, kv_bytes))
        except Exception as exc:  # a build or launch failure: report it, time the rest
            print(f"xqa: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
    if fa3:
        try:
            rows.append(fa3_row(q, kv, indptr, indices, last, reference, common, kv_bytes))
        except Exception as exc:
            print(f"fa3: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
    for s in splits:
        tile = replace(TILES[False], splits=s)
        buffers = SplitBuffers.make(batch, HEADS, KV_HEADS, DIM, s, device) if s > 1 else None
        out = torch.empty_like(q)
        run = lambda: paged_decode(q, pool, 0, indptr, indices, last, DIM ** -0.5, out, tile, buffers)  # noqa: E731
        rows.append(measured(f"triton splits {s}", run, out, reference, common, kv_bytes))
    return rows


def main() -> None:
    global PAGE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="32,64,96,128,160,192,224,256")
    parser.add_argument("--splits", default="1,2,4,8")
    parser.add_argument("--orders", default="drawn", help=f"comma-separated, of {', '.join(ORDERS)}")
    parser.add_argument("--xqa", action="store_true", help="also flashinfer's XQA decode (TensorRT-LLM's kernel)")
    parser.add_argument("--hnd", action="store_true", help="also flashinfer's decodes on an HND copy")
    parser.add_argument("--fa3", action="store_true", help="also flashinfer's fa3 batch prefill, one query a request")
    parser.add_argument("--holistic", action="store_true",
                        help="also flashinfer's persistent BatchAttention, with its plan's host time")
    parser.add_argument("--page", type=int, default=PAGE, help="tokens a page (the Triton kernel needs 16)")
    parser.add_argument("--json")
    args = parser.parse_args()
    PAGE = args.page
    prompt_lens, max_tokens = workload_lengths()
    splits = [int(s) for s in args.splits.split(",") if s]
    orders = args.orders.split(",")
    if unknown := [o for o in orders if o not in ORDERS]:
        parser.error(f"unknown order {unknown[0]!r}: choose from {', '.join(ORDERS)}")
    rows = []
    for batch, order in ((int(b), o) for b in args.batches.split(",") for o in orders):
        got = case(ORDERS[order](contexts_at(batch, prompt_lens, max_tokens)), splits, args.xqa, args.hnd, args.fa3,
                   args.holistic)
        for row in got:
            row["order"] = order
        rows += got
        best = min(got, key=lambda r: r["us"])
        cells = ", ".join(f"{r['kernel']} {r['us']:.1f} us ({r['tb_s']:.2f} TB/s"
                          f"{', diff %.3f' % r['max_diff'] if r['max_diff'] > 0.02 else ''}"
                          f"{', plan %.0f us on the host' % r['plan_us'] if 'plan_us' in r else ''})" for r in got)
        print(f"page {PAGE}, rows {batch} ({order}), context mean {got[0]['mean_context']:.0f} max "
              f"{got[0]['max_context']}: {cells}; best {best['kernel']}", flush=True)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
