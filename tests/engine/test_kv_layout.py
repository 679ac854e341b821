"""The KV pool's two layouts hold the same values: token-major (NHD) and head-major (HND, each page one KV head's
tokens side by side), the paged views flashinfer reads, and the offset formula the Triton kernels address both
with (core/kvcache/pool.py)."""

from __future__ import annotations

import pytest
import torch

from core.kvcache.pool import KVPool

LAYERS, PAGES, PAGE, HEADS, DIM = 2, 5, 4, 3, 8


def _pools() -> tuple[KVPool, KVPool]:
    cpu = torch.device("cpu")
    return (KVPool(LAYERS, PAGES, PAGE, HEADS, DIM, torch.float32, cpu),
            KVPool(LAYERS, PAGES, PAGE, HEADS, DIM, torch.float32, cpu, head_major=True))


def _fill(pools: tuple[KVPool, ...], layer: int, loc: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    k, v = torch.randn(len(loc), HEADS, DIM, generator=gen), torch.randn(len(loc), HEADS, DIM, generator=gen)
    for pool in pools:
        pool.store(layer, loc, k, v)
    return k, v


def test_head_major_pool_stores_and_gathers_what_the_token_major_one_does():
    token_major, head_major = _pools()
    assert (token_major.layout, token_major.head_block) == ("NHD", 1)
    assert (head_major.layout, head_major.head_block) == ("HND", PAGE)
    loc = torch.tensor([17, 0, 5, 6, 19, 8])  # across pages, first and last offsets of a page
    k, v = _fill((token_major, head_major), 1, loc, seed=0)
    slots = torch.tensor([19, 5, 0, 3])  # 3 was never written: zeros in both
    for pool in (token_major, head_major):
        got_k, got_v = pool.gather(1, slots, torch.float32)
        assert torch.equal(got_k[:3], k[[4, 2, 1]]) and torch.equal(got_v[:3], v[[4, 2, 1]])
        assert not got_k[3].any() and not pool.gather(0, loc, torch.float32)[0].any()  # nothing else written
    assert head_major.gather(1, loc, torch.bfloat16)[0].dtype == torch.bfloat16


def test_paged_views_are_each_layouts_page_order():
    """pages(): NHD [pages, page, heads, dim], HND [pages, heads, page, dim]; the same token at (p, o, h)."""
    token_major, head_major = _pools()
    _fill((token_major, head_major), 0, torch.arange(PAGES * PAGE), seed=1)
    nhd_k, nhd_v = token_major.pages(0)
    hnd_k, hnd_v = head_major.pages(0)
    assert nhd_k.shape == (PAGES, PAGE, HEADS, DIM) and hnd_k.shape == (PAGES, HEADS, PAGE, DIM)
    assert torch.equal(hnd_k.transpose(1, 2), nhd_k) and torch.equal(hnd_v.transpose(1, 2), nhd_v)
    assert hnd_k.is_contiguous()  # what flashinfer's HND wrappers are handed


@pytest.mark.parametrize("head_major", [False, True])
def test_the_kernels_offset_formula_finds_every_slot_and_head(head_major):
    """The element offset the fused QKV write and the small decode compute (fused_qkv_triton.kv_head_offset),
    in plain integers: each (slot, head) lands on that token's vector in the flat buffer."""
    pool = _pools()[head_major]
    _fill((pool,), 0, torch.arange(PAGES * PAGE), seed=2)
    flat = pool.k_layers[0].reshape(-1)
    block = pool.head_block
    for slot in range(PAGES * PAGE):
        for head in range(HEADS):
            start = (slot // block) * HEADS * block * DIM + head * block * DIM + (slot % block) * DIM
            expected = pool.gather(0, torch.tensor([slot]), torch.float32)[0][0, head]
            assert torch.equal(flat[start:start + DIM], expected)


def test_an_fp8_pool_is_never_head_major():
    with pytest.raises(ValueError, match="token-major"):
        KVPool(1, 2, 4, 2, 8, torch.bfloat16, torch.device("cpu"), fp8=True, head_major=True)
