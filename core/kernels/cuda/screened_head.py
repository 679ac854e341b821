"""A greedy one-row step's LM head on CUDA through an int8 screen: half the bytes of the largest read of a step.

Why: at batch 1 the LM head is the largest single read of a decode step (Qwen3-0.6B: 151,936 x 1,024 in bf16,
311 MB, about a tenth of the step) and a greedy step that wants no log-probabilities needs only the
largest logit. So, as the CPU's screened head does (core/kernels/cpu/screened_head.py):

1. ``screen_estimate_kernel`` reads an int8 copy of the head (a scale per row, 156 MB) and estimates every
   logit with a rigorous bound on the estimate's error; each row's upper end is stored and the best lower end
   over all rows is raised atomically into a few floats (their largest is the best).
2. ``gated_gemv_kernel`` computes, in the model's dtype, only the blocks of rows whose upper end reaches that
   best lower end, with the plain GEMV's own code and tile (core/kernels/cuda/gemv.py), so a kept logit is the
   unscreened one bit for bit; every other logit is -inf.

A row that is not kept has a logit strictly below the largest, so the largest logit and its first index (the
greedy token, ties included) are the unscreened product's.

The bound, for a row with scale ``s`` and the input ``h``: the int8 copy's rounding moves a logit by at most
``0.50001 s |h|_1``; the float32 sums of the estimate and of the exact product, in any order, by at most
``gamma_K 127 s |h|_1`` each (``gamma_K = K u / (1 - K u)``, ``u = 2**-24``, the weights' magnitudes at most
``127 s``); the exact logit's rounding to bf16 or fp16 by at most ``2**-8`` of its magnitude, which is at most
``|estimate| + A``. ``A = s |h|_1 error_per_l1`` is the first two terms (inflated by the sum of ``|h|`` being a
float32 sum itself), and ``rel_margin`` the last plus room for the bound's own float32 arithmetic.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from core.arith import ceil_div, next_pow2
from core.kernels.cuda.gemv import PLAIN, gemv_config
from core.kernels.cpu.int8_weights import Int8Weight

BLOCK_V = 16  # int8 rows per program of the estimate: 16 KB of a 1,024-wide head
ESTIMATE_WARPS = 4
ESTIMATE_CHUNK = 1024  # columns of the int8 copy a loop step of the estimate reads
GATE_GROUP = 32  # blocks of the plain GEMV's tile looked at by one program of the gated GEMV
BEST_SLOTS = 64  # floats the estimate's programs raise their best lower ends into (program id modulo this)
UNIT = 2.0 ** -24  # float32's unit roundoff


def error_bounds(in_features: int, dtype: torch.dtype) -> tuple[float, float]:
    """(error_per_l1, rel_margin) of the bound above, for a head of ``in_features`` columns whose logits are
    rounded to ``dtype``."""
    gamma = in_features * UNIT / (1 - in_features * UNIT)
    error_per_l1 = (0.50001 + 2 * 127 * gamma * (1 + UNIT)) * (1 + 2 * gamma) * (1 + 8 * UNIT)
    rounding = 2.0 ** -8 if dtype in (torch.bfloat16, torch.float16) else 0.0
    return error_per_l1, rounding + 2.0 ** -20


@functools.cache
def _kernels():
    from core.kernels.cuda.gemv_triton import gated_gemv_kernel  # imports triton
    from core.kernels.cuda.screened_head_triton import screen_estimate_kernel

    return screen_estimate_kernel, gated_gemv_kernel


@dataclass(frozen=True)
class GpuScreenedHead:
    """The head's weight (what kept logits are computed from), its int8 copy and scales, and the buffers one
    call fills: each row's upper end and the best lower end."""

    weight: torch.Tensor
    values: torch.Tensor
    scales: torch.Tensor
    upper: torch.Tensor
    best: torch.Tensor  # [BEST_SLOTS]: the best lower end is their largest

    @classmethod
    def of(cls, weight: torch.Tensor) -> "GpuScreenedHead":
        q8 = Int8Weight.quantize(weight)  # a scale per row: its largest magnitude over 127
        rows = weight.shape[0]
        return cls(weight, q8.values, q8.scales, torch.empty(rows, dtype=torch.float32, device=weight.device),
                   torch.empty(BEST_SLOTS, dtype=torch.float32, device=weight.device))

    @staticmethod
    def takes(hidden: torch.Tensor) -> bool:
        return hidden.dim() == 2 and hidden.shape[0] == 1

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[1, rows]: the logits that can be the largest, exactly as the plain GEMV computes them; -inf elsewhere."""
        if not self.takes(hidden):
            raise ValueError(f"the screened head takes one row, got {tuple(hidden.shape)}")
        estimate, gated = _kernels()
        hidden = hidden.contiguous()
        rows, cols = self.weight.shape
        error_per_l1, rel_margin = error_bounds(cols, self.weight.dtype)
        self.best.fill_(float("-inf"))  # a graph replays this fill with the kernels
        estimate[(ceil_div(rows, BLOCK_V),)](hidden, self.values, self.scales, self.upper, self.best, rows,
                                             error_per_l1, rel_margin, K=cols, BLOCK_V=BLOCK_V,
                                             BLOCK_K=next_pow2(cols), SLOTS=BEST_SLOTS,
                                             CHUNK=min(ESTIMATE_CHUNK, next_pow2(cols)), num_warps=ESTIMATE_WARPS)
        out = torch.empty(1, rows, dtype=hidden.dtype, device=hidden.device)
        cfg = gemv_config(rows, cols, PLAIN)  # the unscreened head's tile: the same sums in the same order
        gated[(ceil_div(rows, cfg.block_n * GATE_GROUP),)](hidden, self.weight, out, self.upper, self.best, rows,
                                                           K=cols, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                                           GROUP=GATE_GROUP, SLOTS=BEST_SLOTS,
                                                           num_warps=cfg.num_warps)
        return out
