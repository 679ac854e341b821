"""The per-token kernels (RMSNorm, residual add + RMSNorm, SiLU-and-mul, RoPE) and the linears, as one table
the layers call.

``TorchKernels`` is plain torch and runs anywhere; in float32 it matches transformers bit for bit. A CPU
engine's linears may hold another form of their weight in their ``packed`` slot, decided by the engine's plan:
the C GEMM's panels (core/kernels/cpu/gemm.py), an int8 or a bf16 copy (core/kernels/cpu/int8_weights.py,
core/kernels/cpu/bf16_weights.py), each with its own ``linear``, or oneDNN's packed tensor
(core/kernels/cpu/onednn_packed.py); ``TorchKernels.linear`` runs whichever the slot holds.
``FlashInferKernels`` swaps in flashinfer's fused CUDA kernels (one launch instead of several, no float32
intermediates in memory), in bf16/fp16 on CUDA, and with ``gemv`` runs each one-row linear (decode at batch 1),
with the norm or the activation in front of it, as one bandwidth-bound Triton kernel (core/kernels/cuda/gemv.py).
With ``split_k`` a linear whose caller says its output is ``summed_later`` (a single rank's o_proj and down, each
followed by an add+RMSNorm) returns ``Partials``, which that add+RMSNorm sums (core/kernels/cuda/split_k.py).
Layers hold a ``kernels`` instance, set for the whole model by ``install_kernels`` from the engine's
``KernelChoices`` (core/kernels/choices.py): the table carries those decisions, and a forward pass only looks
at its own batch's shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from core.kernels.cpu import onednn_packed
from core.kernels.choices import KernelChoices
from core.kernels.cuda.gemv import GEMV_MAX_ROWS, gemv, rms_norm_gemv, silu_mul_gemv
from core.kernels.cpu.bf16_weights import Bf16Weight
from core.kernels.cpu.gemm import PanelWeight
from core.kernels.cpu.int8_weights import Int8Weight
from core.kernels.rope_table import RopeTable
from core.kernels.cuda.split_k import add_rms_norm_partials, slices_for, split_k_linear

# the forms of a weight that multiply by themselves (the ``linear`` method each has)
WEIGHT_FORMS = (PanelWeight, Int8Weight, Bf16Weight)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin``, finished in place in the temporaries it makes (same roundings)."""
    return (x * cos).add_(_rotate_half(x).mul_(sin))


def _rotate_folded(x: torch.Tensor, cos: torch.Tensor, folded_sin: torch.Tensor) -> torch.Tensor:
    """``_rotate`` with rotate_half's sign folded into ``folded_sin`` (its first half negated): the halves are
    swapped instead of swapped and negated, one op fewer, and every product and sum is the same float."""
    half = x.shape[-1] // 2
    return (x * cos).add_(torch.cat((x[..., half:], x[..., :half]), dim=-1).mul_(folded_sin))


@dataclass(frozen=True)
class Partials:
    """A split-K linear's output before its slices are summed: [splits, rows, out] float32. Only the add+RMSNorm
    of ``FlashInferKernels`` takes it, and only a linear told ``summed_later`` returns it."""

    parts: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        """The shape of the sum, [rows, out]: what the kernels look at to choose their path."""
        return self.parts.shape[1:]


@functools.lru_cache(maxsize=64)
def _constant(value: float, device: torch.device) -> torch.Tensor:
    """``value`` as a 0-dim float32 tensor, made once. Kernels treat it exactly as the Python number (a float32
    scalar operand), but an in-place op given a Python number first wraps and converts it: three more kernels
    each time."""
    return torch.tensor(value, dtype=torch.float32, device=device)


@dataclass(frozen=True)
class TorchKernels:
    name: ClassVar[str] = "torch"
    # attention layers take the fused QK-norm + RoPE + KV-write path (core/kernels/cuda/fused_qkv.py)
    fuses_qkv: bool = False
    # one-row linears on the packed weight too (KernelChoices.packed_one_row)
    packed_one_row: bool = False

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """Normalised in float32 and scaled after casting back, as transformers does.

        The mean is ATen's own (a sum, then a division by the count) without the scalar conversions ``mean``
        adds, and the rest runs in place in its temporaries: the same floats with fewer kernels, which is most
        of a norm's time at one row."""
        dtype = x.dtype
        x32 = x if dtype == torch.float32 else x.float()
        count, eps = _constant(float(x32.shape[-1]), x32.device), _constant(eps, x32.device)
        variance = x32.pow(2).sum(-1, keepdim=True).div_(count)
        normed = x32 * variance.add_(eps).rsqrt_()
        normed = normed if dtype == torch.float32 else normed.to(dtype)
        # in place on our own temporary: the same products as ``weight * normed``, one allocation fewer
        return normed.mul_(weight) if weight.dtype == dtype else weight * normed

    @classmethod
    def add_rms_norm(cls, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(x + residual), x + residual): the sum is the next residual."""
        residual = x + residual
        return cls.rms_norm(residual, weight, eps), residual

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               packed_weight: "torch.Tensor | PanelWeight | Int8Weight | Bf16Weight | None",
               summed_later: bool = False) -> torch.Tensor:
        """``x @ weight.T + bias``; ``packed_weight`` is the CPU's other form of the weight, if any (see above).
        ``summed_later``: the output goes straight into an add+RMSNorm, which may take ``Partials`` instead."""
        if isinstance(packed_weight, PanelWeight) and not packed_weight.takes(x):
            packed_weight = None  # a large batch: torch's BLAS on the float32 weight
        if isinstance(packed_weight, WEIGHT_FORMS):
            return packed_weight.linear(x, bias)
        return onednn_packed.linear(x, weight, bias, packed_weight, self.packed_one_row)

    def rms_norm_linear(self, x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None,
                        packed_weight: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(linear(rms_norm(x + residual)), x + residual); with no residual yet, x itself is the residual. On the C
        GEMM's panels the norm runs inside its call."""
        if isinstance(packed_weight, PanelWeight) and packed_weight.takes(x):
            return packed_weight.norm_linear(x, residual, norm_weight, eps, bias)
        if residual is None:
            residual, x = x, self.rms_norm(x, norm_weight, eps)
        else:
            x, residual = self.add_rms_norm(x, residual, norm_weight, eps)
        return self.linear(x, weight, bias, packed_weight), residual

    def silu_mul_linear(self, gate_up: torch.Tensor, weight: torch.Tensor, packed_weight: torch.Tensor | None,
                        summed_later: bool = False) -> torch.Tensor:
        if isinstance(packed_weight, PanelWeight) and packed_weight.takes(gate_up):  # SiLU-and-mul in the call
            return packed_weight.silu_mul_linear(gate_up)
        return self.linear(self.silu_and_mul(gate_up), weight, None, packed_weight, summed_later)

    @staticmethod
    def rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, heads, dim], k: [tokens, kv_heads, dim]; rotated in their own dtype."""
        c = cos[positions].unsqueeze(1).to(q.dtype)
        s = sin[positions].unsqueeze(1).to(q.dtype)
        return _rotate(q, c, s), _rotate(k, c, s)

    @staticmethod
    def rope_qk(positions: torch.Tensor, qk: torch.Tensor, num_q_heads: int,
                rope: RopeTable) -> tuple[torch.Tensor, torch.Tensor]:
        """``rope`` on q and k side by side (qk: [tokens, q_heads + kv_heads, dim], as the QKV projection lays
        them out): one rotation for both, with the table rows gathered once per forward pass (``rope.rows``).
        Returns q and k as views of the rotated tensor."""
        cos, folded_sin = rope.rows(positions, qk.dtype)
        rotated = _rotate_folded(qk, cos, folded_sin)
        return rotated[:, :num_q_heads], rotated[:, num_q_heads:]


@dataclass(frozen=True)
class FlashInferKernels(TorchKernels):
    name: ClassVar[str] = "flashinfer"
    gemv: bool = False  # one-row linears in the Triton GEMV kernels (core/kernels/cuda/gemv.py)
    pdl: bool = False  # those kernels as programmatic dependent launches (KernelChoices.pdl)
    split_k: int = 0  # slices of a summed-later linear's inputs (KernelChoices.split_k); 0: one GEMM

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        from flashinfer.norm import rmsnorm

        return rmsnorm(x, weight, eps)

    @classmethod
    def add_rms_norm(cls, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """In place: ``residual += x`` then ``x = rms_norm(residual)``. Both are this step's own activations."""
        if isinstance(x, Partials):
            return add_rms_norm_partials(x.parts, residual, weight, eps)
        from flashinfer.norm import fused_add_rmsnorm

        fused_add_rmsnorm(x, residual, weight, eps)
        return x, residual

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        from flashinfer.activation import silu_and_mul

        return silu_and_mul(x)

    @staticmethod
    def rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace

        apply_rope_with_cos_sin_cache_inplace(positions, q, k, q.shape[-1], cos_sin, is_neox=True)
        return q, k

    @classmethod
    def rope_qk(cls, positions: torch.Tensor, qk: torch.Tensor, num_q_heads: int,
                rope: RopeTable) -> tuple[torch.Tensor, torch.Tensor]:
        """flashinfer rotates q and k in place, as the views they are."""
        return cls.rope(positions, qk[:, :num_q_heads], qk[:, num_q_heads:], rope.cos, rope.sin, rope.cos_sin)

    def uses_gemv(self, x: torch.Tensor) -> bool:
        """One row, where the Triton kernels beat cuBLAS (and fold the norm or the activation in)."""
        return self.gemv and x.shape[0] <= GEMV_MAX_ROWS

    def split_k_slices(self, x: torch.Tensor, bias: torch.Tensor | None, summed_later: bool) -> int:
        """The slices of a decode step's summed-later linear without a bias (core/kernels/cuda/split_k.py's
        slices_for), or 0: one GEMM (also for a model whose input width does not cut into equal slices)."""
        slices = slices_for(x.shape[0], self.split_k) if summed_later and bias is None else 0
        return slices if slices and x.shape[-1] % slices == 0 else 0

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               packed_weight: torch.Tensor | None, summed_later: bool = False) -> torch.Tensor:
        if self.uses_gemv(x):
            return gemv(x, weight, bias, pdl=self.pdl)
        if slices := self.split_k_slices(x, bias, summed_later):
            return Partials(split_k_linear(x, weight, slices, torch.float32))
        return super().linear(x, weight, bias, packed_weight)

    def rms_norm_linear(self, x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None,
                        packed_weight: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.uses_gemv(x):
            return rms_norm_gemv(x, residual, norm_weight, eps, weight, bias, pdl=self.pdl)
        return super().rms_norm_linear(x, residual, norm_weight, eps, weight, bias, packed_weight)

    def silu_mul_linear(self, gate_up: torch.Tensor, weight: torch.Tensor, packed_weight: torch.Tensor | None,
                        summed_later: bool = False) -> torch.Tensor:
        if self.uses_gemv(gate_up):
            return silu_mul_gemv(gate_up, weight, pdl=self.pdl)
        return super().silu_mul_linear(gate_up, weight, packed_weight, summed_later)


def kernels_for(choices: KernelChoices) -> TorchKernels:
    """The table that runs these choices."""
    if choices.flashinfer:
        return FlashInferKernels(fuses_qkv=choices.fused_qkv, gemv=choices.gemv, pdl=choices.pdl and choices.gemv,
                                 split_k=choices.split_k)
    return TorchKernels(packed_one_row=choices.packed_one_row)


def install_kernels(model: nn.Module, kernels: TorchKernels) -> None:
    """Point every layer that uses these kernels at one table."""
    for module in model.modules():
        if hasattr(module, "kernels"):
            module.kernels = kernels
