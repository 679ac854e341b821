"""On CUDA (compute capability 9.0+): the batch-1 Triton kernels launched as programmatic dependent launches
give the same bits as plain launches, inside a CUDA graph where each kernel reads the one before it.

A dependent launch starts before the previous kernel has finished; a kernel that read its input before waiting
for it would read the last replay's values. So every chain is replayed on fresh inputs and compared with the
plain launches' result for those inputs, bit for bit (same tiles, same sums). Skipped without such a GPU.
"""

from __future__ import annotations

import pytest
import torch

from core.kernels.cuda.gemv import NORM, PLAIN, SILU_MUL, gemv, gemv_config, rms_norm_gemv, silu_mul_gemv
from core.attention.base import QKVSpec
from core.kernels.cuda.small_decode import make_plan, small_decode_attention
from core.layers.rope import RotaryEmbedding
from core.model_config import RopeScaling

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="programmatic dependent launch needs compute capability 9.0")]

HIDDEN, INTER, HEADS, KV_HEADS, DIM, PAGE, CACHED = 1024, 3072, 16, 8, 128, 16, 300


def _layer_inputs(gen: torch.Generator) -> dict:
    dev, bf = "cuda", torch.bfloat16

    def draw(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(dev, bf)

    qkv_out = (HEADS + 2 * KV_HEADS) * DIM
    pages = -(-(CACHED + 1) // PAGE)
    order = torch.randperm(pages + 8, generator=gen)[:pages]
    slots = (pages + 8) * PAGE
    return dict(
        norm1=1 + draw(HIDDEN, scale=0.1), norm2=1 + draw(HIDDEN, scale=0.1),
        w_qkv=draw(qkv_out, HIDDEN, scale=HIDDEN ** -0.5), w_o=draw(HIDDEN, HEADS * DIM, scale=(HEADS * DIM) ** -0.5),
        w_gate_up=draw(2 * INTER, HIDDEN, scale=HIDDEN ** -0.5), w_down=draw(HIDDEN, INTER, scale=INTER ** -0.5),
        q_norm=1 + draw(DIM, scale=0.1), k_norm=1 + draw(DIM, scale=0.1),
        k_cache=draw(slots, KV_HEADS, DIM), v_cache=draw(slots, KV_HEADS, DIM),
        indptr=torch.tensor([0, pages], dtype=torch.int32, device=dev),
        indices=order.to(torch.int32).to(dev),
        last=torch.tensor([CACHED + 1 - (pages - 1) * PAGE], dtype=torch.int32, device=dev),
        out_loc=torch.tensor([int(order[CACHED // PAGE]) * PAGE + CACHED % PAGE], device=dev),
        positions=torch.tensor([CACHED], device=dev))


def _layer(x: torch.Tensor, residual: torch.Tensor, t: dict, spec: QKVSpec, plan, pdl: bool):
    """One decoder layer at batch 1 as the engine runs it: norm+QKV, attention, o_proj, norm+gate_up, down."""
    # the same tiles with and without PDL (the dependent launches' defaults): the same sums
    norm_tile = gemv_config(1, HIDDEN, NORM, pdl=True)
    o_tile, down_tile = gemv_config(1, HEADS * DIM, PLAIN, pdl=True), gemv_config(1, INTER, SILU_MUL, pdl=True)
    qkv, residual = rms_norm_gemv(x, residual, t["norm1"], 1e-6, t["w_qkv"], config=norm_tile, pdl=pdl)
    attn = small_decode_attention(qkv, t["positions"], spec, t["k_cache"], t["v_cache"], t["out_loc"], plan)
    o = gemv(attn.reshape(1, -1), t["w_o"], config=o_tile, pdl=pdl)
    gate_up, residual = rms_norm_gemv(o, residual, t["norm2"], 1e-6, t["w_gate_up"], config=norm_tile, pdl=pdl)
    return silu_mul_gemv(gate_up, t["w_down"], config=down_tile, pdl=pdl), residual


def _run_chain(pdl: bool, inputs: list[torch.Tensor], layers: int = 4) -> list[torch.Tensor]:
    """The chain of ``layers`` layers captured once, replayed on each input; the outputs per input."""
    gen = torch.Generator().manual_seed(7)
    weights = [_layer_inputs(gen) for _ in range(layers)]
    rope = RotaryEmbedding(DIM, 4096, 1e6, RopeScaling()).to("cuda")
    specs = [QKVSpec(HEADS, KV_HEADS, DIM, rope.cos_sin, t["q_norm"], t["k_norm"], 1e-6) for t in weights]
    # 301 cached tokens are three tiles: three active splits and their merge, the rest of the grid idle
    plans = [make_plan(1, HEADS, KV_HEADS, DIM, PAGE, DIM ** -0.5, t["indptr"], t["indices"], t["last"], pdl=pdl)
             for t in weights]
    static_x = torch.zeros(1, HIDDEN, dtype=torch.bfloat16, device="cuda")

    def forward():
        x, residual = static_x, None
        for t, spec, plan in zip(weights, specs, plans):
            x, residual = _layer(x, residual, t, spec, plan, pdl)
        return x + residual

    forward()  # compiles, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward()
    results = []
    for x in inputs:
        static_x.copy_(x)
        graph.replay()
        results.append(out.clone())
    torch.cuda.synchronize()
    return results


def test_dependent_launches_match_plain_launches_bit_for_bit():
    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randn(1, HIDDEN, generator=gen).to("cuda", torch.bfloat16) for _ in range(5)]
    plain = _run_chain(False, inputs)
    dependent = _run_chain(True, inputs)
    for i, (a, b) in enumerate(zip(plain, dependent)):
        assert torch.isfinite(a).all()
        assert torch.equal(a, b), f"input {i}: max diff {(a.float() - b.float()).abs().max().item()}"
    assert not torch.equal(plain[0], plain[1]), "the inputs must change the result"
