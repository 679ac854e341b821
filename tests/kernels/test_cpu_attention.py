"""Decode attention for a batch in C (core/kernels/cpu/attention.py) against SDPA over the gathered keys, and
where the plan turns it on."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core import LLM
from core.config import EngineConfig
from core.engine.plan import plan_engine
from core.kernels.cpu import decode as cpu_decode
from core.kernels.cpu.attention import AttentionRows, CDecodeAttention
from core.kernels.cpu.attention_backend import CAttentionBackend
from core.kernels.cpu.features import cpu_features
from core.attention.base import QKVSpec
from core.bench.reference import HFReference, compare
from core.request import SamplingParams

REASON = cpu_decode.unsupported_reason(cpu_features().flags) or cpu_decode.load_library().reason
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON or "the C kernels build here")
CPU = torch.device("cpu")


def sdpa_reference(q, k_pool, v_pool, slots, lens):
    """Each request's keys and values gathered from its slots, one SDPA call each (float64)."""
    out = []
    for b, length in enumerate(lens.tolist()):
        own = slots[b, :length]
        k, v = k_pool[own].double().transpose(0, 1), v_pool[own].double().transpose(0, 1)  # [kv_heads, len, dim]
        o = F.scaled_dot_product_attention(q[b].double()[:, None], k, v, scale=q.shape[-1] ** -0.5, enable_gqa=True)
        out.append(o[:, 0])
    return torch.stack(out)


@pytest.mark.parametrize("heads, kv_heads, dim", [(9, 3, 64), (8, 2, 128), (4, 4, 32), (10, 2, 48), (6, 3, 40)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("avx512", [False, pytest.param(True, marks=pytest.mark.skipif(
    "avx512f" not in cpu_features().flags, reason="this CPU has no AVX-512"))])
def test_c_decode_attention_matches_sdpa_over_the_gathered_keys(heads, kv_heads, dim, threads, avx512):
    gen = torch.Generator().manual_seed(heads * dim + threads)
    num_slots, lens = 600, torch.tensor([1, 37, 5, 200, 64, 129, 8, 16])
    max_len = int(lens.max())
    k_pool = torch.randn(num_slots, kv_heads, dim, generator=gen)
    v_pool = torch.randn(num_slots, kv_heads, dim, generator=gen)
    # each request's slots scattered over the pool; entries past a request's length are garbage, never read
    slots = torch.stack([torch.randperm(num_slots, generator=gen)[:max_len] for _ in lens])
    slots[0, 1:] = 10 ** 9  # would fault if read
    q = torch.randn(len(lens), heads, dim, generator=gen) * 3  # sharp softmaxes too
    attend = CDecodeAttention(cpu_decode.load_library().library, threads, avx512)
    out = attend(q, k_pool, v_pool, slots.reshape(-1).contiguous(), lens, dim ** -0.5)
    assert out.shape == q.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), sdpa_reference(q, k_pool, v_pool, slots, lens), rtol=1e-5, atol=1e-5)
    # a single token attends to itself alone: its value rows come back exactly
    torch.testing.assert_close(out[0], v_pool[slots[0, 0]].repeat_interleave(heads // kv_heads, 0))


def test_the_plan_runs_it_for_torch_attention_on_a_float32_cpu_pool_only(monkeypatch):
    assert plan_engine(EngineConfig(), CPU, torch.float32).c_attention
    assert not plan_engine(EngineConfig(kv_dtype="fp8"), CPU, torch.float32).c_attention
    assert not plan_engine(EngineConfig(dtype="bfloat16"), CPU, torch.bfloat16).c_attention
    assert not plan_engine(EngineConfig(), torch.device("meta"), torch.float32).c_attention
    monkeypatch.setenv("MINISGL_DISABLE_CPU_DECODE", "1")
    assert not plan_engine(EngineConfig(), CPU, torch.float32).c_attention


def test_batched_decode_in_c_gives_transformers_tokens_on_the_embedded_model(smollm2_dir):
    prompts = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
               "Once upon a time"]
    with LLM(smollm2_dir, device="cpu", max_running_req=4) as llm:
        assert type(llm.engine.attn_backend) is CAttentionBackend
        assert "decode attention in C" in llm.engine.describe()
        outputs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))  # batched
        ids = [llm.tokenizer.encode(p) for p in prompts]
    reference = HFReference(smollm2_dir)
    verdicts = [compare(o["token_ids"], o["finish_reason"], reference.greedy(i, 12, ignore_eos=True), ())
                for o, i in zip(outputs, ids)]
    assert [v.status for v in verdicts] == ["match"] * 4 and all(v.exact for v in verdicts)


def rotated(x, cos_sin):
    """Rotate-half RoPE of x [..., dim] with cos_sin [..., dim] (cos of each frequency, then its sin)."""
    half = x.shape[-1] // 2
    cos, sin = cos_sin[..., :half], cos_sin[..., half:]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def rms_normed(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("heads, kv_heads, dim", [(9, 3, 64), (8, 2, 128), (6, 3, 40)])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_decode_from_the_qkv_output_rotates_writes_the_pool_and_attends(heads, kv_heads, dim, qk_norm, threads):
    gen = torch.Generator().manual_seed(heads + dim + threads + qk_norm)
    num_slots, lens = 500, torch.tensor([1, 37, 5, 90, 64, 8])
    batch, max_len = len(lens), int(lens.max())
    k_pool = torch.randn(num_slots, kv_heads, dim, generator=gen)
    v_pool = torch.randn(num_slots, kv_heads, dim, generator=gen)
    # each request's cached slots, its new token's slot (out_loc) last; past a request's length: never read
    order = torch.randperm(num_slots, generator=gen)
    slots = torch.full((batch, max_len), 10 ** 9, dtype=torch.int64)
    out_loc = torch.empty(batch, dtype=torch.int64)
    taken = 0
    for b, length in enumerate(lens.tolist()):
        slots[b, :length] = order[taken:taken + length]
        out_loc[b] = slots[b, length - 1]
        taken += length
    positions = (lens - 1).to(torch.int64)
    table = torch.randn(256, dim, generator=gen)  # stands in for the RoPE rows: any cos/sin table rotates alike
    gains = (torch.rand(dim, generator=gen) + 0.5, torch.rand(dim, generator=gen) + 0.5)
    q_norm, k_norm = gains if qk_norm else (None, None)
    spec = QKVSpec(heads, kv_heads, dim, table, q_norm, k_norm, 1e-6)
    qkv = torch.randn(batch, (heads + 2 * kv_heads) * dim, generator=gen)
    untouched = torch.ones(num_slots, dtype=torch.bool)
    untouched[out_loc] = False
    k_before, v_before = k_pool.clone(), v_pool.clone()

    attend = CDecodeAttention(cpu_decode.load_library().library, threads, "avx512f" in cpu_features().flags)
    out = attend.from_qkv(qkv, positions, spec, k_pool, v_pool, out_loc,
                          AttentionRows(slots.reshape(-1).contiguous(), max_len, lens), dim ** -0.5)

    q, k, v = qkv.double().split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k, v = q.view(batch, heads, dim), k.view(batch, kv_heads, dim), v.view(batch, kv_heads, dim)
    if qk_norm:
        q, k = rms_normed(q, q_norm.double(), 1e-6), rms_normed(k, k_norm.double(), 1e-6)
    rows = table.double()[positions][:, None]
    q, k = rotated(q, rows), rotated(k, rows)
    torch.testing.assert_close(k_pool[out_loc].double(), k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_pool[out_loc], v.float(), rtol=0, atol=0)  # values are copied as they are
    assert torch.equal(k_pool[untouched], k_before[untouched]) and torch.equal(v_pool[untouched], v_before[untouched])
    torch.testing.assert_close(out.double(), sdpa_reference(q, k_pool, v_pool, slots, lens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_prefills_tokens_attend_causally_over_their_sequences_slots(threads):
    """Prefill as rows: two sequences (one with a cached prefix already in the pool), each token over its
    sequence's slots up to its own position, against float64 causal attention over the rotated keys."""
    gen = torch.Generator().manual_seed(threads)
    heads, kv_heads, dim, num_slots = 6, 2, 32, 300
    cached, new = (0, 5), (7, 4)  # per sequence: tokens already in the pool, tokens of this prefill
    k_pool = torch.randn(num_slots, kv_heads, dim, generator=gen)
    v_pool = torch.randn(num_slots, kv_heads, dim, generator=gen)
    order = torch.randperm(num_slots, generator=gen)
    max_len = max(c + n for c, n in zip(cached, new))
    slots = torch.full((2, max_len), 10 ** 9, dtype=torch.int64)
    slots[0, :7], slots[1, :9] = order[:7], order[7:16]
    positions = torch.cat([torch.arange(c, c + n) for c, n in zip(cached, new)])
    row_seq = torch.tensor([0] * 7 + [1] * 4)
    out_loc = slots[row_seq, positions].contiguous()
    table = torch.randn(64, dim, generator=gen)
    spec = QKVSpec(heads, kv_heads, dim, table, None, None, 1e-6)
    qkv = torch.randn(len(positions), (heads + 2 * kv_heads) * dim, generator=gen)
    attend = CDecodeAttention(cpu_decode.load_library().library, threads, "avx512f" in cpu_features().flags)
    out = attend.from_qkv(qkv, positions, spec, k_pool, v_pool, out_loc,
                          AttentionRows(slots.reshape(-1).contiguous(), max_len, positions + 1, row_seq), dim ** -0.5)

    q, k, v = qkv.double().split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    rows = table.double()[positions][:, None]
    q = rotated(q.view(-1, heads, dim), rows)
    torch.testing.assert_close(k_pool[out_loc].double(), rotated(k.view(-1, kv_heads, dim), rows), rtol=1e-5,
                               atol=1e-5)
    torch.testing.assert_close(v_pool[out_loc], v.view(-1, kv_heads, dim).float(), rtol=0, atol=0)
    own = torch.stack([slots[s] for s in row_seq.tolist()])
    expected = sdpa_reference(q, k_pool, v_pool, own, positions + 1)  # each token over its prefix
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
