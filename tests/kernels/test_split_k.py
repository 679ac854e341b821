"""The split-K linear's partial products sum to the linear, and the add+RMSNorm that sums them gives what
torch's statement of it gives (core/kernels/split_k.py).

The kernel runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed);
those tests are skipped elsewhere. The partials themselves are torch and run anywhere.
"""

from __future__ import annotations

import pytest
import torch

from core.kernels.split_k import add_rms_norm_partials, add_rms_norm_partials_reference, split_k_linear
from core.kernels.triton_available import triton_runs_on

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                  reason="needs triton on CUDA, or TRITON_INTERPRET=1 on a CPU")


@pytest.mark.parametrize("splits", [1, 2, 4, 8])
@pytest.mark.parametrize("rows", [1, 7, 32])
def test_partials_sum_to_the_linear(splits, rows):
    gen = torch.Generator().manual_seed(rows * 10 + splits)
    x = torch.randn(rows, 256, generator=gen).to(DEVICE)
    weight = torch.randn(96, 256, generator=gen).to(DEVICE)
    partials = split_k_linear(x, weight, splits)
    assert partials.shape == (splits, rows, 96)
    for s in range(splits):  # each slice is the product over its own 256/splits inputs
        cols = slice(s * 256 // splits, (s + 1) * 256 // splits)
        torch.testing.assert_close(partials[s], x[:, cols] @ weight[:, cols].T, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(partials.sum(0), x @ weight.T, rtol=1e-5, atol=1e-3)


def test_splits_must_divide_the_inputs():
    with pytest.raises(ValueError, match="do not split"):
        split_k_linear(torch.zeros(2, 100), torch.zeros(8, 100), 3)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits,rows,width", [(1, 3, 64), (2, 5, 1024), (4, 16, 96), (8, 2, 1024)])
def test_add_rms_norm_partials_matches_torch(dtype, splits, rows, width):
    gen = torch.Generator().manual_seed(splits * 100 + rows)
    partials = torch.randn(splits, rows, width, generator=gen).to(DEVICE)
    residual = torch.randn(rows, width, generator=gen).to(DEVICE, dtype)
    weight = (1 + 0.1 * torch.randn(width, generator=gen)).to(DEVICE, dtype)
    expected_out, expected_residual = add_rms_norm_partials_reference(partials, residual, weight, 1e-6)
    before = residual.clone()
    out, new_residual = add_rms_norm_partials(partials, residual, weight, 1e-6)
    assert new_residual.data_ptr() == residual.data_ptr(), "the residual is updated in place"
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    torch.testing.assert_close(new_residual, expected_residual, **tol)
    torch.testing.assert_close(out, expected_out, **tol)
    torch.testing.assert_close(new_residual.float(), (partials.sum(0) + before.float()).to(dtype).float(), **tol)
