"""The GPU's screened LM head keeps every logit that can be the largest, exactly as the plain GEMV computes it.

Runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed); skipped
elsewhere. What must hold for a greedy step to be unchanged: kept logits bit-equal to ``gemv``'s, the rest
-inf and strictly below the largest, the largest and its first index (ties included) the unscreened ones.
"""

from __future__ import annotations

import pytest
import torch

from core.kernels.cuda.gemv import gemv
from core.kernels.cuda.screened_head import GpuScreenedHead, error_bounds
from core.kernels.cuda.triton_available import triton_runs_on

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                reason="needs triton on CUDA, or TRITON_INTERPRET=1 on a CPU")
DTYPES = [torch.float32, torch.bfloat16]


def head_and_rows(rows: int, cols: int, dtype: torch.dtype, seed: int = 0, inputs: int = 4):
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(rows, cols, generator=gen) * cols ** -0.5).to(DEVICE, dtype)
    hidden = [torch.randn(1, cols, generator=gen).to(DEVICE, dtype) for _ in range(inputs)]
    return weight, hidden


def check_screen(head: GpuScreenedHead, hidden: torch.Tensor) -> int:
    """Asserts the screen's promise for one input row; returns how many logits it kept."""
    full = gemv(hidden, head.weight)
    screened = head.logits(hidden)
    kept = screened[0] != float("-inf")
    assert torch.equal(screened[0][kept], full[0][kept]), "a kept logit differs from the plain GEMV's"
    largest = full[0].max()
    assert bool((full[0][~kept] < largest).all()), "a logit that ties the largest was screened out"
    assert int(screened[0].argmax()) == int(full[0].argmax())
    assert bool((head.upper >= full[0].float()).all()), "an upper end below its logit"
    assert float(head.best.max()) <= float(largest)
    return int(kept.sum())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(300, 64), (257, 96), (40, 1100)])
def test_kept_logits_are_the_gemvs(dtype, rows, cols):
    weight, hidden = head_and_rows(rows, cols, dtype)
    head = GpuScreenedHead.of(weight)
    for h in hidden:
        check_screen(head, h)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_keep_the_first_index(dtype):
    """Copies of one row score the same: all of them are kept and the first one is the token."""
    weight, hidden = head_and_rows(200, 64, dtype, seed=1)
    h = hidden[0]
    best = int(gemv(h, weight)[0].argmax())
    for row in (3, best, 150):  # before, at and after the largest: the copies must win from the first one
        weight[row] = weight[best]
    head = GpuScreenedHead.of(weight)
    check_screen(head, h)
    assert int(head.logits(h)[0].argmax()) == min(3, best)


def test_a_peaked_row_keeps_few_logits():
    """One logit far ahead (a trained model's usual step): the screen computes almost nothing else."""
    weight, hidden = head_and_rows(512, 128, torch.bfloat16, seed=2)
    h = hidden[0]
    weight[77] = (h * 0.5).to(weight.dtype)
    head = GpuScreenedHead.of(weight)
    assert check_screen(head, h) <= 4  # the row itself and its block (two rows a block)


def test_quantized_rows_are_within_half_a_step():
    """The bound's first term: the int8 copy is within 0.50001 of a step of every weight."""
    weight, _ = head_and_rows(64, 32, torch.float32, seed=3)
    weight[5] = 0  # a row of zeros gets a positive scale, not a division by zero
    head = GpuScreenedHead.of(weight)
    values, scales = head.values, head.scales
    assert bool(scales[5] > 0) and not values[5].any() and bool(torch.isfinite(scales).all())
    error = (weight - values.float() * scales[:, None]).abs()
    assert bool((error <= 0.50001 * scales[:, None]).all())


def test_the_bound_grows_with_the_width_and_the_rounding():
    narrow, rel_f32 = error_bounds(64, torch.float32)
    wide, rel_bf16 = error_bounds(8192, torch.bfloat16)
    assert 0.5 < narrow < wide and rel_f32 < 2 ** -19 < rel_bf16


def test_more_than_one_row_is_refused():
    weight, _ = head_and_rows(16, 32, torch.float32)
    with pytest.raises(ValueError, match="one row"):
        GpuScreenedHead.of(weight).logits(torch.zeros(2, 32, device=DEVICE))


@pytest.mark.skipif(DEVICE != "cuda", reason="the full Qwen3 head is too slow for the interpreter")
def test_a_qwen3_sized_head():
    weight, hidden = head_and_rows(151936, 1024, torch.bfloat16, seed=4, inputs=8)
    head = GpuScreenedHead.of(weight)
    kept = [check_screen(head, h) for h in hidden]
    assert max(kept) < 1000, kept
