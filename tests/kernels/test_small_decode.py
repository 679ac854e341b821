"""The one-kernel small-batch decode attention gives what the separate steps give: QK-norm and RoPE, the KV
write, and attention over each request's pages.

It runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed); it is
skipped elsewhere, and the GPU check runs it for real (where the splits also race each other to the merge).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import core.kernels.cuda.small_decode as small_decode
from core.attention.base import QKVSpec
from core.kernels.cuda.small_decode import make_plan, small_decode_attention
from core.layers.rope import RotaryEmbedding
from core.kernels.cuda.triton_available import triton_runs_on
from core.model_config import RopeScaling
from tests.kernels.test_fused_qkv import unfused

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                reason="needs triton on CUDA, or TRITON_INTERPRET=1 on a CPU")


def run_case(dtype, heads, kv_heads, dim, page_size, cached_lens, splits, norm, seed=0, head_major=False):
    """Random pools and pages for requests with ``cached_lens`` cached tokens each; returns (got, expected). With
    ``head_major`` the kernel reads and writes the same pool laid out head-major (core/kvcache/pool.py's HND)."""
    gen = torch.Generator().manual_seed(seed)
    batch, eps = len(cached_lens), 1e-6
    pages_per_req = [-(-(n + 1) // page_size) for n in cached_lens]
    num_pages = sum(pages_per_req) + 3
    slots = num_pages * page_size
    k_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(DEVICE, dtype)
    v_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(DEVICE, dtype)
    order = torch.randperm(num_pages, generator=gen)  # pages scattered through the pool
    page_lists, used = [], 0
    for count in pages_per_req:
        page_lists.append(order[used:used + count].tolist())
        used += count
    indptr = torch.tensor([0] + list(torch.tensor(pages_per_req).cumsum(0)), dtype=torch.int32)
    indices = torch.tensor([p for pages in page_lists for p in pages], dtype=torch.int32)
    last = torch.tensor([(n + 1) - (c - 1) * page_size for n, c in zip(cached_lens, pages_per_req)],
                        dtype=torch.int32)
    out_loc = torch.tensor([pages[n // page_size] * page_size + n % page_size
                            for pages, n in zip(page_lists, cached_lens)], device=DEVICE)
    positions = torch.tensor(cached_lens, device=DEVICE)
    rope = RotaryEmbedding(dim, 512, 10000.0, RopeScaling()).to(DEVICE)
    qkv = torch.randn(batch, (heads + 2 * kv_heads) * dim, generator=gen).to(DEVICE, dtype)
    q_w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(DEVICE, dtype) if norm else None
    k_w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(DEVICE, dtype) if norm else None
    scale = dim ** -0.5

    # expected: the separate steps, then plain attention over each request's gathered tokens
    ref_q, ref_k, ref_v = unfused(qkv, heads, kv_heads, dim, positions, rope, q_w, k_w, eps)
    ref_k_cache, ref_v_cache = k_cache.clone(), v_cache.clone()
    ref_k_cache[out_loc], ref_v_cache[out_loc] = ref_k, ref_v
    expected = []
    for i, pages in enumerate(page_lists):
        token_slots = (torch.tensor(pages)[:, None] * page_size + torch.arange(page_size)).flatten()
        token_slots = token_slots[:cached_lens[i] + 1].to(DEVICE)
        k = ref_k_cache[token_slots].float().transpose(0, 1)
        v = ref_v_cache[token_slots].float().transpose(0, 1)
        o = F.scaled_dot_product_attention(ref_q[i].float()[:, None], k, v, scale=scale, enable_gqa=True)
        expected.append(o[:, 0])
    expected = torch.stack(expected).to(dtype)

    plan = make_plan(batch, heads, kv_heads, dim, page_size, scale, indptr.to(DEVICE), indices.to(DEVICE),
                     last.to(DEVICE), splits=splits, head_block=page_size if head_major else 1)
    spec = QKVSpec(heads, kv_heads, dim, rope.cos_sin, q_w, k_w, eps)
    if head_major:  # [pages, kv_heads, page, dim], and back to token rows for the checks below
        by_page = (num_pages, page_size, kv_heads, dim)
        k_pages, v_pages = (c.view(by_page).transpose(1, 2).contiguous() for c in (k_cache, v_cache))
        got = small_decode_attention(qkv, positions, spec, k_pages, v_pages, out_loc, plan)
        k_cache, v_cache = (c.transpose(1, 2).reshape(slots, kv_heads, dim) for c in (k_pages, v_pages))
    else:
        got = small_decode_attention(qkv, positions, spec, k_cache, v_cache, out_loc, plan)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(k_cache[out_loc], ref_k, **tol)
    assert torch.equal(v_cache[out_loc], ref_v)
    untouched = torch.ones(slots, dtype=torch.bool, device=DEVICE)
    untouched[out_loc] = False
    assert torch.equal(k_cache[untouched], ref_k_cache[untouched])
    assert (plan.counters == 0).all(), "the merging split resets its counter for the next layer"
    return got, expected, tol


# Triton's interpreter multiplies bf16 matrices wrongly (tl.dot on their raw bits): bf16 runs on CUDA only
BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(DEVICE == "cpu", reason="bf16 tl.dot needs CUDA"))


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("page_size,cached_lens,splits", [
    (16, [0], 4),  # a one-token sequence: only the new token, every split empty but the first
    (16, [40], 1),
    (16, [15, 16, 17], 4),  # page boundaries
    (1, [5, 70], 8),  # more splits than tiles
    (4, [100], 2),
])
def test_small_decode_matches_the_separate_steps(dtype, page_size, cached_lens, splits):
    got, expected, tol = run_case(dtype, 4, 2, 32, page_size, cached_lens, splits, norm=True)
    torch.testing.assert_close(got, expected, **tol)


@pytest.mark.parametrize("page_size,cached_lens,splits", [(4, [100, 9], 2), (16, [15, 16, 17], 4), (1, [5], 1)])
def test_small_decode_reads_and_writes_a_head_major_pool(page_size, cached_lens, splits):
    got, expected, tol = run_case(torch.float32, 4, 2, 32, page_size, cached_lens, splits, norm=True,
                                  head_major=True)
    torch.testing.assert_close(got, expected, **tol)


@pytest.mark.parametrize("heads,kv_heads,norm", [(2, 2, False), (8, 2, True), (6, 2, True)])
def test_small_decode_head_groups_and_no_qk_norm(heads, kv_heads, norm):
    """Groups of 1, 4 and 3 (not a power of two) query heads per KV head; Llama/Qwen2 layers have no QK-norm."""
    got, expected, tol = run_case(torch.float32, heads, kv_heads, 64, 16, [33, 7], 2, norm, seed=heads)
    torch.testing.assert_close(got, expected, **tol)


@pytest.mark.parametrize("splits", [0, small_decode.GRID_SPLITS + 1])
def test_a_plan_refuses_more_splits_than_its_buffers_hold(splits):
    indptr = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="splits"):
        small_decode.make_plan(1, 4, 2, 32, 16, 1.0, indptr, indptr[1:], indptr[1:], splits=splits)


@pytest.mark.parametrize("cached_lens,splits", [
    ([40, 3], 8),  # one tile each: a single split writes the output, no merge
    ([150, 5], 4),  # two tiles of 128: two splits merge
    ([500], 2),  # more tiles than splits: each split loops over its share
])
def test_small_decode_uses_a_split_per_tile(cached_lens, splits, monkeypatch):
    """The grid's split count is fixed; a request's context decides how many of them work (one per tile of
    BLOCK_T tokens): results do not depend on how many sit idle."""
    monkeypatch.setattr(small_decode, "BLOCK_T", 128)
    got, expected, tol = run_case(torch.float32, 4, 2, 32, 16, cached_lens, splits, norm=True, seed=len(cached_lens))
    torch.testing.assert_close(got, expected, **tol)
