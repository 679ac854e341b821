"""Decode attention for small CUDA-graph batches as one Triton kernel per layer: QK-norm, RoPE, the KV write,
paged attention split over the cached tokens, and the merge of the splits.

At batch 1 the flashinfer path costs three launches per layer (the fused QK-norm/RoPE/KV-write kernel,
flashinfer's decode kernel, the merge of its split-k partial results) to read a few hundred KB of KV: almost
all of it fixed costs, once per layer per token. Here one program handles one
(request, KV head, split): it normalises and rotates the group's query heads and the new key itself, reads
its share of the cached tokens page by page, and split 0 writes the new key and value into their slot and
attends to them from registers (so no program reads a slot another may be writing). A request uses as many
splits as its context has tiles, up to ``GRID_SPLITS``. With one, the program writes the output itself; with
more, each stores its partial result and log-sum-exp and counts itself done on a per-(request, KV head)
counter, and the last one to arrive merges them and resets the counter for the next layer.

Used by the flashinfer backend for captured batches of at most ``SMALL_DECODE_MAX_BS`` rows, where flashinfer's
kernels are dominated by fixed costs; larger batches keep flashinfer's decode, which reads KV near the copy rate.
``MINISGL_DISABLE_SMALL_DECODE=1`` turns it off (for comparisons; read into the engine's plan,
core/engine/plan.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from core.arith import next_pow2
from core.attention.base import QKVSpec

SMALL_DECODE_MAX_BS = 4
# Programs per (request, KV head) in the grid. A request uses one per BLOCK_T cached tokens, up to this many, the
# rest leave at once: the grid is fixed when the graph is captured, the context grows every step. Few large
# splits beat many small ones (every split pays the merge, and one tile per split is read before the wait), and
# idle programs are not free either: 8 is the smallest grid that loses nothing at long contexts
# (docs/BENCHMARKS.md).
GRID_SPLITS = 8
BLOCK_T = 128  # cached tokens per loop iteration, and per split where the context is short enough
NUM_WARPS = 8


@dataclass
class SmallDecodePlan:
    """Device buffers shared by every captured size: the page lists (flashinfer's CSR form) and the splits'
    partial results."""

    kv_indptr: torch.Tensor  # [max_bs + 1] int32
    kv_indices: torch.Tensor  # int32 pages
    kv_last: torch.Tensor  # [max_bs] int32
    part_o: torch.Tensor  # [max_bs * kv_heads * max splits * block_g, head_dim] float32
    part_lse: torch.Tensor  # [max_bs * kv_heads * max splits * block_g] float32
    counters: torch.Tensor  # [max_bs * kv_heads] int32, zero between launches
    page_size: int
    scale: float
    splits: int  # the grid's programs per (request, KV head): GRID_SPLITS (tests use fewer, never more)
    pdl: bool = False  # launched as a programmatic dependent launch (KernelChoices.pdl)
    head_block: int = 1  # the pool's layout: 1 token-major, the page size head-major (KVPool.head_block)


def block_g(num_heads: int, num_kv_heads: int) -> int:
    """Query heads per KV head, padded to the 16 rows a tensor-core product needs."""
    group = num_heads // num_kv_heads
    return max(16, next_pow2(group))


def make_plan(max_bs: int, num_heads: int, num_kv_heads: int, head_dim: int, page_size: int, scale: float,
              kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last: torch.Tensor,
              pdl: bool = False, splits: int = GRID_SPLITS, head_block: int = 1) -> SmallDecodePlan:
    if not 1 <= splits <= GRID_SPLITS:  # the partial buffers hold GRID_SPLITS per (request, KV head)
        raise ValueError(f"a small decode takes 1 to {GRID_SPLITS} splits, not {splits}")
    rows = max_bs * num_kv_heads * GRID_SPLITS * block_g(num_heads, num_kv_heads)
    device = kv_indptr.device
    return SmallDecodePlan(kv_indptr, kv_indices, kv_last,
                           torch.empty(rows, head_dim, dtype=torch.float32, device=device),
                           torch.empty(rows, dtype=torch.float32, device=device),
                           torch.zeros(max_bs * num_kv_heads, dtype=torch.int32, device=device), page_size, scale,
                           splits=splits, pdl=pdl, head_block=head_block)


@functools.cache
def _kernel():
    from core.kernels.cuda.small_decode_triton import decode_attention_kernel  # imports triton

    return decode_attention_kernel


def small_decode_attention(qkv: torch.Tensor, positions: torch.Tensor, spec: QKVSpec, k_cache: torch.Tensor,
                           v_cache: torch.Tensor, out_loc: torch.Tensor, plan: SmallDecodePlan) -> torch.Tensor:
    """qkv: [batch, (heads + 2 * kv_heads) * head_dim], one new token per request; k_cache, v_cache: one layer of
    the pool, in the layout ``plan.head_block`` says. Writes the new k and v at ``out_loc``; returns [batch, heads,
    head_dim]."""
    batch = qkv.shape[0]
    out = torch.empty(batch, spec.num_heads, spec.head_dim, dtype=qkv.dtype, device=qkv.device)
    norm = spec.q_norm_weight is not None
    unused = spec.cos_sin  # a valid pointer when there is no QK-norm
    _kernel()[(batch, spec.num_kv_heads, plan.splits)](
        qkv, qkv.stride(0), positions, spec.cos_sin, spec.q_norm_weight if norm else unused,
        spec.k_norm_weight if norm else unused, spec.eps, k_cache, v_cache, out_loc, plan.kv_indptr,
        plan.kv_indices, plan.kv_last, plan.part_o, plan.part_lse, plan.counters, out, plan.scale,
        NUM_HEADS=spec.num_heads, NUM_KV_HEADS=spec.num_kv_heads, HEAD_DIM=spec.head_dim,
        PAGE_SIZE=plan.page_size, GROUP=spec.num_heads // spec.num_kv_heads,
        BLOCK_G=block_g(spec.num_heads, spec.num_kv_heads), BLOCK_T=BLOCK_T, SPLITS=plan.splits, NORM=norm,
        DOT_PRECISION="ieee" if qkv.dtype == torch.float32 else "tf32", PDL=plan.pdl,  # tf32: unused for bf16
        HEAD_BLOCK=plan.head_block,
        num_warps=NUM_WARPS, **({"launch_pdl": True} if plan.pdl else {}))
    return out
