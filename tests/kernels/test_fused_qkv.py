"""The fused QK-norm + RoPE + KV-write kernel gives what the separate torch steps give.

It runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed); it is
skipped elsewhere, and the GPU check runs it for real.
"""

from __future__ import annotations

import pytest
import torch

from core.kernels.cuda.fused_qkv import qkv_norm_rope_store
from core.kernels.dispatch import TorchKernels
from core.layers.rope import RotaryEmbedding
from core.kernels.cuda.triton_available import triton_runs_on
from core.model_config import RopeScaling

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                reason="needs triton on CUDA, or TRITON_INTERPRET=1 on a CPU")


def unfused(qkv, heads, kv_heads, dim, positions, rope, q_w, k_w, eps):
    """The model's path without the fused kernel: split, per-head RMSNorm, RoPE."""
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k, v = q.reshape(-1, heads, dim), k.reshape(-1, kv_heads, dim), v.reshape(-1, kv_heads, dim)
    if q_w is not None:
        q = (q.float() * torch.rsqrt(q.float().pow(2).mean(-1, keepdim=True) + eps) * q_w.float()).to(qkv.dtype)
        k = (k.float() * torch.rsqrt(k.float().pow(2).mean(-1, keepdim=True) + eps) * k_w.float()).to(qkv.dtype)
    cos = rope.cos[positions].unsqueeze(1)
    sin = rope.sin[positions].unsqueeze(1)
    half = dim // 2

    def rotate(x):
        x = x.float()
        return (x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin).to(qkv.dtype)

    return rotate(q), rotate(k), v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim,norm", [(16, True), (128, True), (64, False)])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 2), (3, 3), (9, 3)])  # padded rows must write nothing
def test_fused_kernel_matches_the_separate_steps(dtype, dim, norm, heads, kv_heads):
    gen = torch.Generator().manual_seed(dim)
    tokens, slots, eps = 5, 12, 1e-6
    rope = RotaryEmbedding(dim, 64, 10000.0, RopeScaling()).to(DEVICE)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(DEVICE, dtype)
    positions = torch.tensor([0, 3, 17, 40, 63], device=DEVICE)
    out_loc = torch.tensor([7, 2, 11, 0, 5], device=DEVICE)
    q_w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(DEVICE, dtype) if norm else None
    k_w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(DEVICE, dtype) if norm else None
    k_cache = torch.full((slots, kv_heads, dim), 9.0, dtype=dtype, device=DEVICE)
    v_cache = torch.full((slots, kv_heads, dim), 9.0, dtype=dtype, device=DEVICE)

    q = qkv_norm_rope_store(qkv, heads, kv_heads, dim, positions, rope.cos_sin, q_w, k_w, eps, k_cache, v_cache,
                            out_loc)

    ref_q, ref_k, ref_v = unfused(qkv, heads, kv_heads, dim, positions, rope, q_w, k_w, eps)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    assert q.shape == (tokens, heads, dim) and q.is_contiguous()
    torch.testing.assert_close(q, ref_q, **tol)
    torch.testing.assert_close(k_cache[out_loc], ref_k, **tol)
    assert torch.equal(v_cache[out_loc], ref_v)  # a plain copy
    untouched = torch.ones(slots, dtype=torch.bool, device=DEVICE)
    untouched[out_loc] = False
    assert (k_cache[untouched] == 9).all() and (v_cache[untouched] == 9).all()


def test_fused_kernel_agrees_with_the_models_torch_kernels_in_float32():
    """Against TorchKernels themselves (what the torch backend runs): same q and k to float32 rounding."""
    gen = torch.Generator().manual_seed(0)
    tokens, heads, kv_heads, dim, eps = 3, 2, 1, 32, 1e-6
    rope = RotaryEmbedding(dim, 16, 1e6, RopeScaling()).to(DEVICE)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(DEVICE)
    w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(DEVICE)
    positions = torch.tensor([1, 2, 9], device=DEVICE)
    k_cache = torch.zeros(4, kv_heads, dim, device=DEVICE)
    v_cache = torch.zeros(4, kv_heads, dim, device=DEVICE)
    q = qkv_norm_rope_store(qkv, heads, kv_heads, dim, positions, rope.cos_sin, w, w, eps, k_cache, v_cache,
                            torch.tensor([3, 0, 1], device=DEVICE))
    q_ref, k_ref, v_ref = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q_ref = TorchKernels.rms_norm(q_ref.reshape(tokens, heads, dim), w, eps)
    k_ref = TorchKernels.rms_norm(k_ref.reshape(tokens, kv_heads, dim), w, eps)
    q_ref, k_ref = TorchKernels.rope(positions, q_ref, k_ref, rope.cos, rope.sin, rope.cos_sin)
    torch.testing.assert_close(q, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_cache[[3, 0, 1]], k_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v_cache[[3, 0, 1]], v_ref.reshape(tokens, kv_heads, dim), atol=0, rtol=0)


@pytest.mark.parametrize("page_size", [1, 4])
def test_fused_kernel_writes_a_head_major_pool_where_the_pool_reads(page_size):
    """Into a head-major pool (core/kvcache/pool.py's HND) the kernel writes what it writes into a token-major
    one: the pool reads the same k and v back at every slot, and every other slot keeps its value."""
    from core.kvcache.pool import KVPool

    gen = torch.Generator().manual_seed(page_size)
    tokens, heads, kv_heads, dim, eps = 5, 4, 2, 32, 1e-6
    rope = RotaryEmbedding(dim, 64, 10000.0, RopeScaling()).to(DEVICE)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen).to(DEVICE)
    positions = torch.tensor([0, 3, 17, 40, 63], device=DEVICE)
    out_loc = torch.tensor([7, 2, 11, 0, 5], device=DEVICE)
    w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(DEVICE)
    pools = [KVPool(1, 12 // page_size, page_size, kv_heads, dim, torch.float32, torch.device(DEVICE),
                    head_major=major) for major in (False, True)]
    every_slot = torch.arange(12, device=DEVICE)
    before = torch.randn(12, kv_heads, dim, generator=gen).to(DEVICE)
    for pool in pools:  # the same values everywhere first, so that a stray write shows
        pool.store(0, every_slot, before, -before)
        qkv_norm_rope_store(qkv, heads, kv_heads, dim, positions, rope.cos_sin, w, w, eps, pool.k_layers[0],
                            pool.v_layers[0], out_loc, head_block=pool.head_block)
    (token_k, token_v), (head_k, head_v) = (pool.gather(0, every_slot, torch.float32) for pool in pools)
    assert torch.equal(head_k, token_k) and torch.equal(head_v, token_v)
    _, ref_k, ref_v = unfused(qkv, heads, kv_heads, dim, positions, rope, w, w, eps)
    torch.testing.assert_close(head_k[out_loc], ref_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(head_v[out_loc], ref_v)
    untouched = torch.ones(12, dtype=torch.bool, device=DEVICE)
    untouched[out_loc] = False
    assert torch.equal(head_k[untouched], before[untouched]) and torch.equal(head_v[untouched], -before[untouched])


@pytest.mark.skipif(DEVICE == "cpu", reason="Triton's interpreter rounds float32 to e4m3 wrongly where rounding "
                    "carries into the exponent (127.4 becomes 64, not 128)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kernel_quantises_into_an_fp8_pool_as_the_pool_does(dtype):
    """With an fp8 pool's layer the kernel stores what KVPool.store stores for the same k and v: the same
    scales, and e4m3 values that dequantise to the same vectors (one rounding step apart at most)."""
    from core.kvcache.pool import KVPool

    gen = torch.Generator().manual_seed(3)
    tokens, heads, kv_heads, dim, eps = 4, 4, 2, 64, 1e-6
    rope = RotaryEmbedding(dim, 64, 10000.0, RopeScaling()).to(DEVICE)
    qkv = (3 * torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)).to(DEVICE, dtype)
    positions = torch.tensor([0, 5, 9, 30], device=DEVICE)
    out_loc = torch.tensor([6, 1, 3, 4], device=DEVICE)
    w = (1 + 0.1 * torch.randn(dim, generator=gen)).to(DEVICE, dtype)
    fused = KVPool(1, 8, 1, kv_heads, dim, dtype, torch.device(DEVICE), fp8=True)
    reference = KVPool(1, 8, 1, kv_heads, dim, dtype, torch.device(DEVICE), fp8=True)

    q = qkv_norm_rope_store(qkv, heads, kv_heads, dim, positions, rope.cos_sin, w, w, eps, fused.k[0], fused.v[0],
                            out_loc, fused.k_scale[0], fused.v_scale[0])

    ref_q, ref_k, ref_v = unfused(qkv, heads, kv_heads, dim, positions, rope, w, w, eps)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(q, ref_q, **tol)
    reference.store(0, out_loc, ref_k, ref_v)
    torch.testing.assert_close(fused.k_scale[0], reference.k_scale[0], **tol)
    torch.testing.assert_close(fused.v_scale[0], reference.v_scale[0], rtol=1e-6, atol=0)
    got_k, got_v = fused.gather(0, out_loc, torch.float32)
    want_k, want_v = reference.gather(0, out_loc, torch.float32)
    # e4m3 values at most one step apart (k came out of a different rounding of the norm and RoPE; a division
    # may round the other way), and v, a plain copy before quantising, nearly always the same value
    for got, want in ((got_k, want_k), (got_v, want_v)):
        assert ((got - want).abs() <= want.abs() / 8 + 1e-6).all()
    assert (got_v == want_v).float().mean() > 0.95
    untouched = torch.ones(8, dtype=torch.bool, device=DEVICE)
    untouched[out_loc] = False
    assert (fused.k_scale[0][untouched] == 1).all() and (fused.k[0][untouched].float() == 0).all()
