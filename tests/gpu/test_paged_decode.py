"""On CUDA: the Triton paged decode kernel (core/kernels/cuda/paged_decode.py), both variants, against float32
attention over the same pages, bf16 and fp8; and an fp8 engine's greedy tokens against the bf16 engine's.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from core.kernels.cuda.paged_decode import ALL_HEADS_TILE, DecodeTile, paged_decode
from core.kvcache.pool import KVPool

pytestmark = pytest.mark.gpu


def float_attention(q, pool, layer, pages, lengths, scale):
    out = []
    for b, (own, length) in enumerate(zip(pages, lengths)):
        slots = (torch.tensor(own, device=q.device)[:, None] * pool.page_size
                 + torch.arange(pool.page_size, device=q.device)[None, :]).reshape(-1)[:length]
        k, v = pool.gather(layer, slots, torch.float32)  # [length, kv_heads, dim]
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        s = torch.einsum("hd,thd->ht", q[b].float(), k) * scale
        out.append(torch.einsum("ht,thd->hd", s.softmax(-1), v))
    return torch.stack(out)


TILES = [None, DecodeTile(64, 4, 2, splits=2), DecodeTile(128, 4, 2, splits=4, f16=True), ALL_HEADS_TILE,
         DecodeTile(16, 8, 2, splits=4, f16=True, all_heads=True, head_dots=True),
         DecodeTile(16, 8, 2, f16=True, all_heads=True), DecodeTile(32, 8, 2, splits=4, f16=True, all_heads=True)]


@pytest.mark.parametrize("tile", TILES, ids=["default", "2 splits", "4 splits f16", "all heads",
                                             "all heads 4 splits", "block-diagonal", "block-diagonal 4 splits"])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_decode_matches_float_attention(fp8, page_size, tile):
    torch.manual_seed(0)
    device = torch.device("cuda")
    heads, kv_heads, dim, layers = 16, 8, 128, 2
    lengths = [1, 17, 64, 300, 1000, 5]
    pages_needed = [-(-n // page_size) for n in lengths]
    pool = KVPool(layers, sum(pages_needed) + 3, page_size, kv_heads, dim, torch.bfloat16, device, fp8=fp8)
    order = torch.randperm(sum(pages_needed)).tolist()  # pages scattered over the pool
    pages, start = [], 0
    for count in pages_needed:
        pages.append(order[start:start + count])
        start += count
    for layer in range(layers):
        slots = torch.arange(pool.num_slots, device=device)
        pool.store(layer, slots, torch.randn(pool.num_slots, kv_heads, dim, device=device).bfloat16() * 3,
                   torch.randn(pool.num_slots, kv_heads, dim, device=device).bfloat16())
    q = torch.randn(len(lengths), heads, dim, device=device).bfloat16()
    indptr = torch.tensor([0] + torch.tensor(pages_needed).cumsum(0).tolist(), dtype=torch.int32, device=device)
    indices = torch.tensor([p for own in pages for p in own], dtype=torch.int32, device=device)
    last = torch.tensor([n - (c - 1) * page_size for n, c in zip(lengths, pages_needed)], dtype=torch.int32,
                        device=device)
    got = paged_decode(q, pool, 1, indptr, indices, last, dim ** -0.5, tile=tile).float()
    want = float_attention(q, pool, 1, pages, lengths, dim ** -0.5)
    assert (got - want).abs().max().item() < 2e-2


def test_fp8_engine_greedy_tokens_stay_near_the_bf16_engines():
    """fp8 KV (flashinfer backend: ragged prefill over the dequantised pool, the Triton paged decode under CUDA
    graphs) parts from bf16 only where the two engines' next tokens are near-ties (each in the other's top 5);
    and so does the torch backend's fp8 path (eager, fresh keys in prefill)."""
    from core import LLM, SamplingParams
    from core.bench.reference import near_tie_compare

    prompts = [list(range(10 + i, 200 + 3 * i)) for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    kw = dict(max_running_req=8, max_seq_len=512, kv_cache_gb=1.0, page_size=16)
    ref = LLM("random:small-qwen3", **kw)
    bf16 = [o["token_ids"] for o in ref.generate(prompts, params)]
    for attention, backend in ((None, "FlashInferFp8Backend"), ("torch", "PagedTorchBackend")):
        llm = LLM("random:small-qwen3", kv_dtype="fp8", attention=attention, **kw)
        assert type(llm.engine.attn_backend).__name__ == backend
        assert (llm.engine.graphs is not None) == (attention is None)
        fp8 = [o["token_ids"] for o in llm.generate(prompts, params)]
        assert all(len(t) == 24 for t in fp8)
        verdict = near_tie_compare(ref, llm, prompts, bf16, fp8)
        assert verdict.ok, (backend, verdict.details)
        llm.close()


def test_fp8_engine_on_the_all_heads_tile_stays_near_the_default_tiles(monkeypatch):
    """``TILES[True] = ALL_HEADS_TILE`` (the one entry that makes the fp8 decode take the all-heads variant)
    gives an engine under CUDA graphs whose greedy tokens part from the default tile's only at near-ties."""
    from core import LLM, SamplingParams
    from core.kernels.cuda.paged_decode import TILES
    from core.bench.reference import near_tie_compare

    prompts = [list(range(10 + i, 200 + 3 * i)) for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    kw = dict(max_running_req=8, max_seq_len=512, kv_cache_gb=1.0, page_size=16, kv_dtype="fp8")
    default = LLM("random:small-qwen3", **kw)
    want = [o["token_ids"] for o in default.generate(prompts, params)]
    monkeypatch.setitem(TILES, True, ALL_HEADS_TILE)
    all_heads = LLM("random:small-qwen3", **kw)
    assert all_heads.engine.graphs.decode is not None
    got = [o["token_ids"] for o in all_heads.generate(prompts, params)]
    verdict = near_tie_compare(default, all_heads, prompts, want, got)
    assert verdict.ok, verdict.details
    all_heads.close()


def test_fp8_prefill_over_a_cached_prefix_matches_a_cold_one():
    """A prompt whose first pages are in the prefix cache (ragged prefill of the dequantised prefix plus the new
    tokens) continues as it does with nothing cached, near-ties allowed; chunked prefill takes the same path."""
    from core import LLM, SamplingParams
    from core.bench.reference import near_tie_compare

    shared = list(range(100, 260))
    prompts = [shared + list(range(7 * i, 7 * i + 40)) for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    kw = dict(max_running_req=8, max_seq_len=512, kv_cache_gb=1.0, page_size=16, kv_dtype="fp8")
    cold = LLM("random:small-qwen3", cache="naive", **kw)
    want = [o["token_ids"] for o in cold.generate(prompts, params)]
    warm = LLM("random:small-qwen3", max_extend_tokens=64, **kw)  # radix cache on; prefill in chunks of 64
    warm.generate([shared + [1, 2, 3]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    got = [o["token_ids"] for o in warm.generate(prompts, params)]
    verdict = near_tie_compare(cold, warm, prompts, want, got)
    assert verdict.ok, verdict.details
