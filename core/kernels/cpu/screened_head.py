"""A greedy batch's LM head through an int8 screen (gemm.c's screened_logits_rows), on a CPU with AVX512-VNNI.

Why: a greedy step that wants no log-probabilities needs only each row's largest logit, and the float32 LM head
is most of a CPU decode step's FLOPs (SmolLM2-135M: 49,152 x 576).
Every logit is estimated on an int8 copy with VNNI's integer dot products, with a rigorous bound on its error;
only those that can still be a row's largest are computed in float32, exactly as the C GEMM computes them (the
same panels, the same order of sums), and the rest come back as -inf. So a row's maximum and its first index are
the unscreened product's, and greedy tokens do not change (gemm.c says why). The one-request C step screens
its own head the same way (decode.c's screened_logits).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.arith import ceil_div
from core.kernels.c_build import address
from core.kernels.cpu.decode import head_block_magnitudes, head_int8
from core.kernels.cpu.gemm import PanelWeight, _library
from core.kernels.derived import DerivedCache

NEEDED_FLAGS = ("avx512f", "avx512bw", "avx512_vnni")
SCREEN = 16  # weight rows per group of the int8 copy, and the lanes of a row's best lower ends (gemm.c's SCREEN)


def unsupported_reason(flags: frozenset[str]) -> str:
    """Why this CPU cannot screen the head ('' when it can): the estimate needs AVX-512 with VNNI."""
    missing = [f for f in NEEDED_FLAGS if f not in flags]
    return f"the screened LM head needs {', '.join(missing)}" if missing else ""


def row_magnitudes(weight: torch.Tensor) -> torch.Tensor:
    """[rows]: each row's sum of magnitudes, in float64 and rounded up to float32, so the bound never comes out
    low."""
    l1 = weight.detach().double().abs().sum(dim=1)
    return torch.nextafter(l1.float(), torch.tensor(float("inf"))).contiguous()


@dataclass(frozen=True)
class ScreenedHead:
    """The head's panels (what the kept logits are computed from) and its int8 copy packed for the estimate, with
    each row's scale and magnitude and each block's sums of int8 values and of magnitudes."""

    panels: PanelWeight
    packed: torch.Tensor
    scales: torch.Tensor
    qsums: torch.Tensor
    l1: torch.Tensor
    row_l1: torch.Tensor

    @classmethod
    def of(cls, weight: torch.Tensor, panels: PanelWeight, cache: DerivedCache | None = None) -> "ScreenedHead":
        """``cache``: where the int8 copy and the magnitudes are read back from (derived from ``weight`` when it
        has none; the head's entries, shared with the C decode step's screen)."""
        lib = _library()
        cache = cache or DerivedCache()
        q8 = head_int8(weight, cache)
        rows, cols = q8.values.shape
        groups, blocks = ceil_div(rows, SCREEN), lib.screen_blocks(cols)
        packed = torch.empty(lib.screen_bytes(rows, cols), dtype=torch.int8)
        qsums = torch.empty(groups, blocks, SCREEN, dtype=torch.int32)
        l1 = torch.empty(groups, blocks, SCREEN, dtype=torch.float32)
        magnitudes = head_block_magnitudes(weight, cache)  # held here: the C call reads it
        lib.screen_pack(q8.values.data_ptr(), address(magnitudes), rows, cols, packed.data_ptr(), qsums.data_ptr(),
                        l1.data_ptr())
        row_l1 = cache.get("lm_head.row_l1", lambda: (row_magnitudes(weight),))[0]
        return cls(panels, packed, q8.scales, qsums, l1, row_l1)

    @staticmethod
    def takes(hidden: torch.Tensor) -> bool:
        """Rows the C GEMM takes (the kept logits are computed on its panels)."""
        return PanelWeight.takes(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, vocab] for float32 hidden [rows, in]: each row's logits that can be its largest, as
        ``panels.linear`` computes them, and -inf for the rest."""
        lib = _library()
        weight = self.panels
        x = hidden.reshape(-1, weight.in_features).float().contiguous()
        rows, k, n = x.shape[0], weight.in_features, weight.out_features
        out = torch.empty(rows, n)
        xq = torch.empty(rows, ceil_div(k, 4) * 4, dtype=torch.uint8)
        steps, info = torch.empty(rows, lib.screen_blocks(k)), torch.empty(rows, 2)
        tops = torch.empty(weight.threads, rows, SCREEN)
        lib.screened_logits_rows(x.data_ptr(), rows, k, weight.panels.data_ptr(), n, self.packed.data_ptr(),
                                 address(self.scales), address(self.qsums, torch.int32), address(self.l1),
                                 address(self.row_l1), out.data_ptr(), xq.data_ptr(), steps.data_ptr(),
                                 info.data_ptr(), tops.data_ptr(), weight.threads)
        return out.reshape(*hidden.shape[:-1], n)
