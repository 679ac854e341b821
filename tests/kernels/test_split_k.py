"""The split-K linear's partial products sum to the linear, and the add+RMSNorm that sums them gives what
torch's statement of it gives (core/kernels/cuda/split_k.py).

The kernel runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed);
those tests are skipped elsewhere. The partials themselves are torch and run anywhere.
"""

from __future__ import annotations

import pytest
import torch

from core.kernels.cuda.split_k import (add_rms_norm_partials, add_rms_norm_partials_reference, slices_for,
                                  split_k_linear)
from core.kernels.cuda.triton_available import triton_runs_on

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


def test_few_rows_take_four_slices_and_many_rows_the_engines_choice():
    assert [slices_for(rows, 2) for rows in (1, 64, 128, 129, 256, 257)] == [4, 4, 4, 2, 2, 0]
    assert [slices_for(rows, 8) for rows in (1, 200)] == [8, 8]
    assert slices_for(1, 0) == slices_for(200, 0) == 0  # MINISGL_SPLIT_K=0: never


@needs_triton
@pytest.mark.parametrize("splits, rows, slices", [(2, 9, 4), (2, 200, 2), (4, 200, 4)])
def test_a_layer_chain_with_split_k_matches_plain_kernels(splits, rows, slices):
    """o_proj through the split-K kernels, then the add+RMSNorm in front of the next linear: the same rows and the
    same residual as the plain linear and torch's add+RMSNorm (float32, where torch's batched GEMM is the plain
    one), and the RowParallelLinear of one rank hands its partials on, in as many slices as its rows take."""
    from core.kernels.dispatch import FlashInferKernels, Partials, TorchKernels
    from core.layers.linear import RowParallelLinear

    gen = torch.Generator().manual_seed(splits)
    layer = RowParallelLinear(256, 64).to(DEVICE)
    layer.weight.data.copy_(torch.randn(64, 256, generator=gen))
    x = torch.randn(rows, 256, generator=gen).to(DEVICE)
    residual = torch.randn(rows, 64, generator=gen).to(DEVICE)
    norm_weight = (1 + 0.1 * torch.randn(64, generator=gen)).to(DEVICE)

    layer.kernels = TorchKernels()
    plain = layer(x)
    expected = TorchKernels.add_rms_norm(plain, residual.clone(), norm_weight, 1e-6)
    layer.kernels = FlashInferKernels(split_k=splits)
    split = layer(x)
    assert isinstance(split, Partials) and split.parts.shape == (slices, rows, 64)
    normed, new_residual = layer.kernels.add_rms_norm(split, residual.clone(), norm_weight, 1e-6)
    torch.testing.assert_close(new_residual, expected[1], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(normed, expected[0], rtol=1e-5, atol=1e-4)
    # the next layer's norm and linear take the partials as they take a tensor
    nxt = torch.randn(32, 64, generator=gen).to(DEVICE)
    projected, _ = layer.kernels.rms_norm_linear(split, residual.clone(), norm_weight, 1e-6, nxt, None, None)
    torch.testing.assert_close(projected, expected[0] @ nxt.T, rtol=1e-4, atol=1e-3)
    # without split_k, or with inputs that do not cut into equal slices, the kernels return the whole product
    assert not isinstance(FlashInferKernels().linear(x, layer.weight, None, None, summed_later=True), Partials)
    odd_x, odd_weight = x[:, :255].contiguous(), layer.weight[:, :255].contiguous()
    whole = FlashInferKernels(split_k=splits).linear(odd_x, odd_weight, None, None, summed_later=True)
    torch.testing.assert_close(whole, odd_x @ odd_weight.T)


@pytest.mark.parametrize("raw,slices", [("", 2), ("0", 0), ("4", 4), (" 8 ", 8)])
def test_the_split_k_knob(monkeypatch, raw, slices):
    from core import env

    monkeypatch.setenv("MINISGL_SPLIT_K", raw)
    assert env.split_k_slices() == slices


@pytest.mark.parametrize("raw", ["two", "-1", "17", "2.5"])
def test_a_bad_split_k_knob_is_refused(monkeypatch, raw):
    from core import env
    from core.errors import InvalidParamsError

    monkeypatch.setenv("MINISGL_SPLIT_K", raw)
    with pytest.raises(InvalidParamsError, match="MINISGL_SPLIT_K"):
        env.split_k_slices()
