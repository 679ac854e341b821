"""The gate_up linear with its SiLU-and-mul in one kernel gives what the two steps give.

It runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed); it is
skipped elsewhere. bf16 runs on CUDA only (the interpreter's bf16 tl.dot is wrong).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.kernels.dispatch import TorchKernels
from core.kernels.gate_up_silu import GateUpTile, default_tile, gate_up_silu
from core.kernels.triton_available import triton_runs_on

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                reason="needs triton on CUDA, or TRITON_INTERPRET=1 on a CPU")
BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(DEVICE == "cpu", reason="bf16 tl.dot needs CUDA"))


def two_steps(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The unfused path: the GEMM's output in x's dtype, then the model's SiLU-and-mul."""
    return TorchKernels.silu_and_mul(F.linear(x, weight))


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("rows,hidden,intermediate,tile", [
    (5, 64, 48, GateUpTile(16, 32, 32)),  # rows, features and inputs all past a block's edge
    (33, 96, 64, GateUpTile(32, 64, 64)),  # a second row block with one real row
    (64, 128, 128, None),  # the default tile
    (1, 32, 16, GateUpTile(16, 16, 16)),
])
def test_fused_kernel_matches_the_gemm_then_silu_and_mul(dtype, rows, hidden, intermediate, tile):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, hidden, generator=gen).to(DEVICE, dtype)
    weight = (torch.randn(2 * intermediate, hidden, generator=gen) / hidden ** 0.5).to(DEVICE, dtype)
    got = gate_up_silu(x, weight, tile)
    assert got.shape == (rows, intermediate) and got.dtype == dtype
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got, two_steps(x, weight), **tol)


def test_gate_and_up_are_the_weights_two_halves():
    """A weight whose up half is all ones: every output is silu(gate) times the row's sum of inputs."""
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5]], device=DEVICE)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]], device=DEVICE)
    got = gate_up_silu(x, weight, GateUpTile(16, 16, 16))
    gate, total = x, x.sum(dim=1, keepdim=True)
    torch.testing.assert_close(got, F.silu(gate) * total)


def test_default_tiles_fit_the_rows_and_bad_shapes_are_refused():
    assert [default_tile(r).block_m for r in (1, 16, 17, 32, 33, 256)] == [16, 16, 32, 32, 64, 64]
    x = torch.zeros(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="does not take"):
        gate_up_silu(x, torch.zeros(6, 4, device=DEVICE))
    with pytest.raises(ValueError, match="does not take"):
        gate_up_silu(x, torch.zeros(5, 8, device=DEVICE))
    assert gate_up_silu(x[:0], torch.zeros(4, 8, device=DEVICE)).shape == (0, 2)
