"""The small-batch linear kernels give what a norm, an activation and ``F.linear`` give separately.

They run on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed); they
are skipped elsewhere, and the GPU check runs them for real.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from core.layers.gemv import GemvConfig, gemv, gemv_available, gemv_config, rms_norm_gemv, silu_mul_gemv
from core.layers.kernels import TorchKernels

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not gemv_available() or (DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs triton on CUDA, or TRITON_INTERPRET=1 on a CPU")

# (rows, out, in, tiles): odd sizes so that both masks (features and columns) are exercised
SHAPES = [(1, 40, 96, GemvConfig(8, 64, 4)), (3, 33, 64, GemvConfig(4, 32, 2)), (8, 16, 200, None)]


def tensors(rows, out, inp, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(DEVICE, dtype)

    return draw, draw(rows, inp), draw(out, inp, scale=inp ** -0.5)


def close(actual, expected, dtype):
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(actual, expected, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,out,inp,config", SHAPES)
def test_gemv_matches_linear(dtype, rows, out, inp, config):
    draw, x, weight = tensors(rows, out, inp, dtype)
    bias = draw(out)
    close(gemv(x, weight, None, config), F.linear(x, weight), dtype)
    close(gemv(x, weight, bias, config), F.linear(x, weight, bias), dtype)


def test_gemv_reads_rows_with_a_stride():
    """A slice of a wider buffer (the step's rows inside a padded one) is read in place."""
    _, x, weight = tensors(4, 24, 48, torch.float32)
    wide = torch.zeros(4, 80, device=DEVICE)
    wide[:, 16:64] = x
    close(gemv(wide[:, 16:64], weight), F.linear(x, weight), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("rows,out,inp,config", SHAPES)
def test_rms_norm_gemv_matches_norm_then_linear(dtype, with_residual, rows, out, inp, config):
    draw, x, weight = tensors(rows, out, inp, dtype, seed=1)
    residual = draw(rows, inp) if with_residual else None
    gain = (1 + 0.1 * torch.randn(inp, generator=torch.Generator().manual_seed(2))).to(DEVICE, dtype)
    x_before = x.clone()
    res_before = residual.clone() if with_residual else None

    y, new_residual = rms_norm_gemv(x, residual, gain, 1e-6, weight, None, config)

    if with_residual:
        normed, expected_residual = TorchKernels.add_rms_norm(x, residual, gain, 1e-6)
        assert torch.equal(residual, res_before), "the residual passed in must be left as it was"
    else:
        normed, expected_residual = TorchKernels.rms_norm(x, gain, 1e-6), x
    assert torch.equal(x, x_before)
    close(new_residual, expected_residual, dtype)
    close(y, F.linear(normed, weight), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,out,inp,config", SHAPES)
def test_silu_mul_gemv_matches_activation_then_linear(dtype, rows, out, inp, config):
    draw, _, weight = tensors(rows, out, inp, dtype, seed=3)
    gate_up = draw(rows, 2 * inp)
    close(silu_mul_gemv(gate_up, weight, config), F.linear(TorchKernels.silu_and_mul(gate_up), weight), dtype)


def test_no_rows_gives_an_empty_result():
    _, _, weight = tensors(1, 8, 16, torch.float32)
    assert gemv(torch.empty(0, 16, device=DEVICE), weight).shape == (0, 8)


def test_config_keeps_enough_programs_and_whole_chunks():
    assert gemv_config(1, 1024, 3072) == GemvConfig(2, 1024, 4)
    assert gemv_config(1, 4096, 1024).block_n == 8
    assert gemv_config(1, 576, 576).block_k == 1024
    assert gemv_config(1, 151936, 1024).block_n == 16
