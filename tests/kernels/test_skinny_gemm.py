"""The few-row linear kernel gives what a norm, an activation and ``F.linear`` give separately, and each row
what it would get alone.

It runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed); it is
skipped elsewhere, and the GPU check runs it for real.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.kernels.dispatch import TorchKernels
from core.kernels.skinny_gemm import (SKINNY_MAX_ROWS, SkinnyConfig, skinny_linear, skinny_rms_norm_linear,
                                      skinny_silu_mul_linear)
from core.kernels.triton_available import triton_runs_on

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                reason="needs triton on CUDA, or TRITON_INTERPRET=1 on a CPU")

BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(DEVICE == "cpu", reason="bf16 tl.dot needs CUDA"))
# (rows, out, in, tiles): odd sizes so that every mask (rows, features, columns) is exercised, and several chunks
SHAPES = [(3, 40, 96, SkinnyConfig(16, 32, 4, 2)), (17, 33, 64, SkinnyConfig(32, 16, 2, 3)),
          (40, 24, 48, SkinnyConfig(16, 16, 4, 2, block_m=16)),  # three blocks of rows
          (2, 16, 200, None)]


def tensors(rows, out, inp, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(DEVICE, dtype)

    return draw, draw(rows, inp), draw(out, inp, scale=inp ** -0.5)


def close(actual, expected, dtype):
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(actual, expected, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("rows,out,inp,config", SHAPES)
def test_skinny_linear_matches_linear(dtype, rows, out, inp, config):
    draw, x, weight = tensors(rows, out, inp, dtype)
    bias = draw(out)
    close(skinny_linear(x, weight, None, config), F.linear(x, weight), dtype)
    close(skinny_linear(x, weight, bias, config), F.linear(x, weight, bias), dtype)


def test_a_row_gets_the_same_bits_whatever_the_batch_around_it():
    """A request's result must not depend on which others share its step (graphs pad batches, requests come
    and go): row i of a batch equals that row multiplied alone, bit for bit."""
    _, x, weight = tensors(SKINNY_MAX_ROWS, 48, 96, torch.float32, seed=4)
    whole = skinny_linear(x, weight)
    for rows in (2, 5, 16, 33):
        assert torch.equal(skinny_linear(x[:rows].clone(), weight), whole[:rows])


def test_more_rows_than_the_tile_holds_are_refused():
    _, _, weight = tensors(1, 8, 16, torch.float32)
    with pytest.raises(ValueError, match="rows"):
        skinny_linear(torch.zeros(SKINNY_MAX_ROWS + 1, 16, device=DEVICE), weight)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("rows,out,inp,config", SHAPES)
def test_skinny_rms_norm_linear_matches_norm_then_linear(dtype, with_residual, rows, out, inp, config):
    draw, x, weight = tensors(rows, out, inp, dtype, seed=1)
    residual = draw(rows, inp) if with_residual else None
    gain = (1 + 0.1 * torch.randn(inp, generator=torch.Generator().manual_seed(2))).to(DEVICE, dtype)
    x_before = x.clone()
    res_before = residual.clone() if with_residual else None

    y, new_residual = skinny_rms_norm_linear(x, residual, gain, 1e-6, weight, None, config)

    if with_residual:
        normed, expected_residual = TorchKernels.add_rms_norm(x, residual, gain, 1e-6)
        assert torch.equal(residual, res_before), "the residual passed in must be left as it was"
    else:
        normed, expected_residual = TorchKernels.rms_norm(x, gain, 1e-6), x
    assert torch.equal(x, x_before)
    close(new_residual, expected_residual, dtype)
    close(y, F.linear(normed, weight), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("rows,out,inp,config", SHAPES)
def test_skinny_silu_mul_linear_matches_activation_then_linear(dtype, rows, out, inp, config):
    draw, _, weight = tensors(rows, out, inp, dtype, seed=3)
    gate_up = draw(rows, 2 * inp)
    expected = F.linear(TorchKernels.silu_and_mul(gate_up), weight)
    close(skinny_silu_mul_linear(gate_up, weight, config), expected, dtype)
