"""The small-batch linear kernels give what a norm, an activation and ``F.linear`` give separately.

They run on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed); they
are skipped elsewhere, and the GPU check runs them for real.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.kernels.cuda.gemv import NORM, GemvConfig, gemv, gemv_config, rms_norm_gemv, silu_mul_gemv
from core.kernels.dispatch import TorchKernels
from core.kernels.cuda.triton_available import triton_runs_on

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                reason="needs triton on CUDA, or TRITON_INTERPRET=1 on a CPU")

# (out, in, tiles): odd sizes so that both masks (features and columns) are exercised, and several chunks
SHAPES = [(40, 96, GemvConfig(8, 32, 4)), (33, 64, GemvConfig(4, 64, 2)), (16, 200, None)]


def tensors(out, inp, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def draw(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(DEVICE, dtype)

    return draw, draw(1, inp), draw(out, inp, scale=inp ** -0.5)


def close(actual, expected, dtype):
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(actual, expected, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out,inp,config", SHAPES)
def test_gemv_matches_linear(dtype, out, inp, config):
    draw, x, weight = tensors(out, inp, dtype)
    bias = draw(out)
    close(gemv(x, weight, None, config), F.linear(x, weight), dtype)
    close(gemv(x, weight, bias, config), F.linear(x, weight, bias), dtype)


def test_gemv_reads_a_row_at_any_offset():
    """A slice of a wider buffer (one row of a step's buffer) is read in place, whatever its alignment."""
    _, x, weight = tensors(24, 48, torch.float32)
    wide = torch.zeros(1, 80, device=DEVICE)
    wide[:, 3:51] = x
    close(gemv(wide[:, 3:51], weight), F.linear(x, weight), torch.float32)


def test_more_than_one_row_is_refused():
    _, _, weight = tensors(8, 16, torch.float32)
    with pytest.raises(ValueError, match="one row"):
        gemv(torch.zeros(2, 16, device=DEVICE), weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("out,inp", [(40, 96), (33, 64), (16, 200)])
def test_rms_norm_gemv_matches_norm_then_linear(dtype, with_residual, out, inp):
    draw, x, weight = tensors(out, inp, dtype, seed=1)
    residual = draw(1, inp) if with_residual else None
    gain = (1 + 0.1 * torch.randn(inp, generator=torch.Generator().manual_seed(2))).to(DEVICE, dtype)
    x_before = x.clone()
    res_before = residual.clone() if with_residual else None

    y, new_residual = rms_norm_gemv(x, residual, gain, 1e-6, weight)

    if with_residual:
        normed, expected_residual = TorchKernels.add_rms_norm(x, residual, gain, 1e-6)
        assert torch.equal(residual, res_before), "the residual passed in must be left as it was"
    else:
        normed, expected_residual = TorchKernels.rms_norm(x, gain, 1e-6), x
    assert torch.equal(x, x_before)
    close(new_residual, expected_residual, dtype)
    close(y, F.linear(normed, weight), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("out,inp,config", SHAPES)
def test_silu_mul_gemv_matches_activation_then_linear(dtype, out, inp, config):
    draw, _, weight = tensors(out, inp, dtype, seed=3)
    gate_up = draw(1, 2 * inp)
    close(silu_mul_gemv(gate_up, weight, config), F.linear(TorchKernels.silu_and_mul(gate_up), weight), dtype)


def test_a_folded_norm_needs_the_whole_row_in_one_chunk():
    _, x, weight = tensors(8, 96, torch.float32)
    gain = torch.ones(96, device=DEVICE)
    with pytest.raises(ValueError, match="whole row"):
        rms_norm_gemv(x, None, gain, 1e-6, weight, None, GemvConfig(2, 64, 4))
    assert gemv_config(1024, 3072, NORM).block_k == 4096
    assert gemv_config(1024, 3072).block_k == 1024
