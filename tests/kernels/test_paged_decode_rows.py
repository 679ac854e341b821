"""The paged decode's all-heads variant (``DecodeTile.all_heads``: one program per request and split over whole
token rows) gives float32 attention over the same pages, fp8 and plain, and what the per-head kernel gives.

It runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed); it is
skipped elsewhere. The pools are filled with ``KVPool.store`` (torch's float32-to-e4m3 rounding: the
interpreter's rounds wrongly at exponent carries). Triton's interpreter multiplies bf16 matrices wrongly, so
bf16 queries take the float16 products here, as the engine's fp8 tile does.
"""

from __future__ import annotations

import pytest
import torch

from core.kernels.cuda.paged_decode import ALL_HEADS_TILE, DecodeTile, SplitBuffers, paged_decode
from core.kernels.cuda.triton_available import triton_runs_on
from core.kvcache.pool import KVPool
from tests.gpu.test_paged_decode import float_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                reason="needs triton on CUDA, or TRITON_INTERPRET=1 on a CPU")

LENGTHS = [1, 3, 13, 40, 4]  # one token, part of a page, several pages and a partial one, whole pages


def scattered_case(heads, kv_heads, dim, page_size, fp8, q_dtype, seed=0):
    """A pool whose pages are scattered over the requests of ``LENGTHS`` cached tokens: (pool, q, page lists,
    indptr, indices, last-page lengths)."""
    gen = torch.Generator().manual_seed(seed)
    pages_needed = [-(-n // page_size) for n in LENGTHS]
    store_dtype = torch.bfloat16 if fp8 and q_dtype == torch.bfloat16 else torch.float32
    pool = KVPool(1, sum(pages_needed) + 2, page_size, kv_heads, dim, store_dtype, torch.device(DEVICE), fp8=fp8)
    order = torch.randperm(sum(pages_needed), generator=gen).tolist()
    pages, start = [], 0
    for count in pages_needed:
        pages.append(order[start:start + count])
        start += count
    k = torch.randn(pool.num_slots, kv_heads, dim, generator=gen) * 3
    v = torch.randn(pool.num_slots, kv_heads, dim, generator=gen)
    pool.store(0, torch.arange(pool.num_slots, device=DEVICE), k.to(DEVICE), v.to(DEVICE))
    q = torch.randn(len(LENGTHS), heads, dim, generator=gen).to(DEVICE, q_dtype)
    indptr = torch.tensor([0] + torch.tensor(pages_needed).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    indices = torch.tensor([p for own in pages for p in own], dtype=torch.int32, device=DEVICE)
    last = torch.tensor([n - (c - 1) * page_size for n, c in zip(LENGTHS, pages_needed)], dtype=torch.int32,
                        device=DEVICE)
    return pool, q, pages, indptr, indices, last


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """float32 products: within 1e-4. bf16 out of float16 products: within 2e-2 as on the GPU, plus one bf16
    step of the value (the interpreter truncates float32 to bf16 where a GPU rounds)."""
    error = (got.float() - want.float()).abs()
    if got.dtype == torch.float32:
        return error.max().item() < 1e-4
    return bool((error <= 2e-2 + 2 ** -7 * want.float().abs()).all())


@pytest.mark.parametrize("head_dots", [False, True], ids=["block-diagonal", "head-dots"])
@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(4, 2, 16, 4), (4, 2, 32, 4), (6, 3, 16, 2), (6, 2, 16, 4), (16, 8, 16, 4)],
                         ids=["4q2kv-d16-p4", "4q2kv-d32-p4", "6q3kv-d16-p2", "6q2kv-d16-p4", "16q8kv-d16-p4"])
def test_all_heads_fp8_matches_float_attention(shape, q_dtype, splits, head_dots):
    heads, kv_heads, dim, page_size = shape
    pool, q, pages, indptr, indices, last = scattered_case(heads, kv_heads, dim, page_size, True, q_dtype)
    tile = DecodeTile(16, 4, 2, splits=splits, f16=True, all_heads=True, head_dots=head_dots)
    buffers = SplitBuffers.make(len(LENGTHS), heads, kv_heads, dim, 4, q.device)
    got = paged_decode(q, pool, 0, indptr, indices, last, dim ** -0.5, tile=tile, split_buffers=buffers)
    want = float_attention(q, pool, 0, pages, LENGTHS, dim ** -0.5)
    assert got.dtype == q_dtype and got.shape == q.shape
    assert close(got, want)
    assert not buffers.counters.any()  # the merging programs reset their counters for the next layer


@pytest.mark.parametrize("head_dots", [False, True], ids=["block-diagonal", "head-dots"])
@pytest.mark.parametrize("tokens", [16, 32])
def test_all_heads_plain_pages_match_float_attention(tokens, head_dots):
    """Without fp8 the variant reads the pool's own dtype (no scales)."""
    pool, q, pages, indptr, indices, last = scattered_case(4, 2, 16, 4, False, torch.float32)
    tile = DecodeTile(tokens, 4, 2, splits=2, all_heads=True, head_dots=head_dots)
    got = paged_decode(q, pool, 0, indptr, indices, last, 16 ** -0.5, tile=tile)
    assert close(got, float_attention(q, pool, 0, pages, LENGTHS, 16 ** -0.5))


def test_all_heads_matches_the_per_head_kernel_on_the_engine_tile():
    """The engine's all-heads tile against the per-head kernel (which shares its page walk and softmax step)
    on the same bf16 queries, both against float32 attention."""
    pool, q, pages, indptr, indices, last = scattered_case(4, 2, 32, 4, True, torch.bfloat16, seed=1)
    got = paged_decode(q, pool, 0, indptr, indices, last, 32 ** -0.5, tile=ALL_HEADS_TILE)
    per_head = paged_decode(q, pool, 0, indptr, indices, last, 32 ** -0.5,
                            tile=DecodeTile(16, 4, 2, splits=2, f16=True))
    assert close(got, per_head.float())
    assert close(per_head, float_attention(q, pool, 0, pages, LENGTHS, 32 ** -0.5))
