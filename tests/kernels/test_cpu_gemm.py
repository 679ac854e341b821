"""The C GEMM (core/kernels/cpu/gemm.c): float32 products close to float64's, every row count and shape edge, and
a row's result the same whatever else shares its batch."""

from __future__ import annotations

import pytest
import torch

from core.kernels.cpu import gemm as cpu_gemm
from core.kernels.cpu.features import cpu_features
from core.kernels.cpu.gemm import PanelWeight, panel_linears
from core.kernels.cpu.four_bit import q4_codes
from core.kernels.dispatch import TorchKernels

REASON = cpu_gemm.unsupported_reason(cpu_features().flags) or cpu_gemm.load_library().reason
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON or "the C GEMM runs here")


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ weight.double().T
    return out if bias is None else out + bias.double()


# rows: one, a part block, a whole block, more than a chunk of rows; outputs: under one panel, a part panel, a
# whole number of panels (SmolLM2's 576 and 960), more than a thread's share; inputs: short and wide
@pytest.mark.parametrize("rows, out_features, in_features", [
    (1, 5, 3), (7, 50, 17), (8, 96, 64), (9, 960, 576), (33, 576, 1536), (300, 100, 576), (130, 49, 1000)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_products_are_within_float32_rounding_of_float64(rows, out_features, in_features, with_bias):
    gen = torch.Generator().manual_seed(rows * 1000 + out_features)
    weight = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    out = PanelWeight.of(weight, threads=2).linear(x, bias)
    assert out.shape == (rows, out_features) and out.dtype == torch.float32
    expected = reference(x, weight, bias)
    # an in-order float32 sum of n products of unit normals: errors of order sqrt(n) * n * 2^-24 at most
    bound = 4 * in_features * 2.0 ** -24 * x.abs().sum(1, keepdim=True).double() * weight.abs().max().item()
    error = (out.double() - expected).abs()
    assert bool((error <= bound).all()), float((error / bound).max())
    assert torch.allclose(out.double(), expected, rtol=1e-5, atol=1e-4)


def test_a_rows_result_does_not_depend_on_its_batch():
    """One in-order sum per output: a request gets the same bits alone, first, or in the middle of a batch."""
    gen = torch.Generator().manual_seed(3)
    weight, x = torch.randn(200, 576, generator=gen), torch.randn(40, 576, generator=gen)
    panels = PanelWeight.of(weight, threads=2)
    whole = panels.linear(x)
    for begin, end in ((5, 6), (0, 9), (13, 40), (31, 33)):
        assert torch.equal(panels.linear(x[begin:end]), whole[begin:end])
    assert torch.equal(PanelWeight.of(weight, threads=1).linear(x), whole)  # nor on the threads


def test_leading_dimensions_are_kept_and_an_empty_batch_is_empty():
    weight = torch.randn(20, 12)
    panels = PanelWeight.of(weight, threads=2)
    x = torch.randn(2, 3, 12)
    out = panels.linear(x)
    assert out.shape == (2, 3, 20)
    assert torch.allclose(out, x @ weight.T, rtol=1e-5, atol=1e-5)
    assert panels.linear(torch.randn(0, 12)).shape == (0, 20)


def test_wrong_inputs_are_refused():
    panels = PanelWeight.of(torch.randn(20, 12), threads=2)
    with pytest.raises(ValueError, match=r"float32 \[\.\.\., 12\]"):
        panels.linear(torch.randn(3, 11))
    with pytest.raises(ValueError, match=r"float32 \[\.\.\., 12\]"):
        panels.linear(torch.randn(3, 12, dtype=torch.float64))
    with pytest.raises(ValueError, match="packs 2-D float32 CPU weights"):
        PanelWeight.of(torch.randn(20, 12).to(torch.bfloat16), threads=2)


def test_panel_linears_fills_only_empty_slots():
    model = torch.nn.Module()
    model.a, model.b = torch.nn.Linear(8, 4, bias=False), torch.nn.Linear(8, 4, bias=False)
    model.a.packed, model.b.packed = None, "another form"
    assert panel_linears(model, threads=2) == 1
    assert isinstance(model.a.packed, PanelWeight) and model.b.packed == "another form"
    x = torch.randn(3, 8)
    assert torch.allclose(model.a.packed.linear(x), model.a(x), rtol=1e-5, atol=1e-6)


def test_unsupported_cpus_are_named():
    assert "lacks AVX-512F" in cpu_gemm.unsupported_reason(frozenset({"avx2", "fma"}), machine="x86_64")
    assert "written for x86-64" in cpu_gemm.unsupported_reason(frozenset(), machine="aarch64")
    assert cpu_gemm.unsupported_reason(frozenset({"avx512f", "fma"}), machine="x86_64") == ""


@pytest.mark.parametrize("rows, in_features, out_features", [(1, 576, 960), (32, 576, 3072), (5, 40, 50), (300, 64, 96)])
def test_the_norm_and_the_activation_inside_the_call_match_torchs_ops_in_front_of_the_product(rows, in_features,
                                                                                               out_features):
    """What the decoder's layers call: rms_norm(x + residual) then the product, and SiLU-and-mul then the product,
    against TorchKernels' own ops (the torch path, bit-exact with transformers) in front of the same product."""
    gen = torch.Generator().manual_seed(rows + in_features)
    torch_kernels = TorchKernels()
    weight, bias = torch.randn(out_features, in_features, generator=gen) * 0.05, torch.randn(out_features, generator=gen)
    panels = PanelWeight.of(weight, threads=2)
    x, residual = torch.randn(rows, in_features, generator=gen), torch.randn(rows, in_features, generator=gen)
    gain = torch.rand(in_features, generator=gen) + 0.5
    for res in (None, residual):
        out, new_residual = panels.norm_linear(x, res, gain, 1e-5, bias)
        normed, expected_residual = (torch_kernels.rms_norm(x, gain, 1e-5), x) if res is None else \
            torch_kernels.add_rms_norm(x, res, gain, 1e-5)
        assert torch.equal(new_residual, expected_residual)  # the sum is one float add either way
        torch.testing.assert_close(out, panels.linear(normed, bias), rtol=1e-5, atol=1e-5)
    gate_up = torch.randn(rows, 2 * in_features, generator=gen) * 4  # saturated SiLUs too
    torch.testing.assert_close(panels.silu_mul_linear(gate_up), panels.linear(torch_kernels.silu_and_mul(gate_up)),
                               rtol=1e-5, atol=1e-5)
    assert panels.silu_mul_linear(gate_up[:0]).shape == (0, out_features)


def test_large_batches_go_to_torchs_blas_and_small_ones_to_the_panels(monkeypatch):
    weight = torch.randn(64, 32)
    panels = PanelWeight.of(weight, threads=2)
    assert panels.takes(torch.randn(cpu_gemm.MAX_ROWS, 32)) and not panels.takes(torch.randn(cpu_gemm.MAX_ROWS + 1, 32))
    calls = []
    monkeypatch.setattr(PanelWeight, "linear", lambda self, x, bias=None: calls.append(x.shape[0]) or x @ weight.T)
    table = TorchKernels()
    for rows in (3, cpu_gemm.MAX_ROWS + 1):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(table.linear(x, weight, None, panels), x @ weight.T, rtol=1e-5, atol=1e-5)
    assert calls == [3]  # the large batch ran torch.mm on the float32 weight


# ---- 4-bit panels ------------------------------------------------------------------------------------------------
def four_bit_weight(out_features: int, in_features: int, seed: int) -> torch.Tensor:
    """A weight made as a Q4_1 GGUF dequantises: codes 0..15 per block of 32 inputs (each block holding a 0 and a
    15, as the quantiser's min and max do), float16 d and m, float32 d * q + m."""
    gen = torch.Generator().manual_seed(seed)
    blocks = in_features // 32
    codes = torch.randint(0, 16, (out_features, blocks, 32), generator=gen).float()
    codes[..., 0], codes[..., 1] = 0, 15
    d = (torch.rand(out_features, blocks, 1, generator=gen) * 0.02 + 1e-3).half().float()
    m = (-torch.rand(out_features, blocks, 1, generator=gen) * 0.2).half().float()
    return (codes * d + m).reshape(out_features, in_features)


def test_four_bit_codes_give_back_every_float_and_refuse_other_weights():
    weight = four_bit_weight(70, 96, seed=1)
    codes, d, m = q4_codes(weight)
    assert codes.dtype == torch.uint8 and int(codes.max()) == 15 and d.shape == m.shape == (70, 3)
    rebuilt = codes.float().reshape(70, 3, 32) * d[..., None] + m[..., None]
    assert torch.equal(rebuilt.reshape(70, 96), weight)
    nudged = weight.clone()
    nudged[3, 40] = torch.nextafter(nudged[3, 40], torch.tensor(1.0))  # one float off the grid
    assert q4_codes(nudged) is None
    assert q4_codes(torch.randn(8, 64)) is None  # a float32 weight
    assert q4_codes(four_bit_weight(8, 64, seed=2)[:, :48]) is None  # inputs not in blocks of 32


@pytest.mark.parametrize("rows, out_features, in_features", [
    (1, 5, 32), (7, 50, 64), (8, 96, 576), (33, 576, 1536), (130, 49, 96), (600, 100, 576)])
def test_four_bit_panels_compute_the_float32_panels_products_bit_for_bit(rows, out_features, in_features):
    weight = four_bit_weight(out_features, in_features, seed=rows)
    four, plain = PanelWeight.of(weight, 2, q4_codes(weight)), PanelWeight.of(weight, 2)
    assert four.q4 is not None and four.panels.numel() == 0 and plain.q4 is None
    assert four.q4.numel() * 5 < plain.panels.numel() * 4  # under a fifth of the bytes
    gen = torch.Generator().manual_seed(7)
    x, residual = torch.randn(rows, in_features, generator=gen), torch.randn(rows, in_features, generator=gen)
    bias, norm = torch.randn(out_features, generator=gen), torch.rand(in_features, generator=gen)
    assert torch.equal(four.linear(x, bias), plain.linear(x, bias))
    for got, want in zip(four.norm_linear(x, residual, norm, 1e-6), plain.norm_linear(x, residual, norm, 1e-6)):
        assert torch.equal(got, want)
    half = in_features // 2 // 32 * 32
    if half:  # silu-and-mul needs the down projection's width: a weight over half the inputs
        down = four_bit_weight(out_features, half, seed=3)
        gate_up = torch.randn(rows, 2 * half, generator=gen)
        assert torch.equal(PanelWeight.of(down, 2, q4_codes(down)).silu_mul_linear(gate_up),
                           PanelWeight.of(down, 2).silu_mul_linear(gate_up))


def test_every_row_count_in_a_block_gives_a_full_blocks_bits():
    """Each row count up to a block has its own copy of the loop, and a 4-bit panel is expanded a slab at a time:
    the first rows of a batch, cut at every count, give the whole batch's bits (k = 576: four slabs and a half)."""
    weight = four_bit_weight(100, 576, seed=5)
    x = torch.randn(16, 576, generator=torch.Generator().manual_seed(6))
    for panels in (PanelWeight.of(weight, 2, q4_codes(weight)), PanelWeight.of(weight, 2)):
        whole = panels.linear(x)
        for rows in range(1, 17):
            assert torch.equal(panels.linear(x[:rows]), whole[:rows]), rows


def test_a_float32_weight_stays_on_float32_panels_when_four_bit_is_asked():
    weight = torch.randn(40, 64)
    packed = PanelWeight.of(weight, 2, q4_codes(weight))
    assert packed.q4 is None and packed.panels.numel() > 0
