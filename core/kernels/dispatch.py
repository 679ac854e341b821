"""The per-token kernels (RMSNorm, residual add + RMSNorm, SiLU-and-mul, RoPE) and the linears, chosen in one
place.

``TorchKernels`` is plain torch and runs anywhere; in float32 it matches transformers bit for bit.
``FlashInferKernels`` swaps in flashinfer's fused CUDA kernels (one launch instead of several, no float32
intermediates in memory), in bf16/fp16 on CUDA, and for one row (decode at batch 1) runs each linear, with
the norm or the activation in front of it, as one bandwidth-bound Triton kernel (core/kernels/gemv.py).
Layers hold a ``kernels`` attribute, set for the whole model by ``install_kernels``; the engine picks
flashinfer's set exactly when it runs flashinfer attention, so ``attention='torch'`` runs the whole model in
plain torch, the reference to compare against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.env import fused_qkv_disabled, gemv_disabled
from core.kernels import onednn_packed
from core.kernels.gemv import GEMV_MAX_ROWS, gemv, rms_norm_gemv, silu_mul_gemv
from core.kernels.triton_available import triton_available, triton_runs_on


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin``, finished in place in the temporaries it makes (same roundings)."""
    return (x * cos).add_(_rotate_half(x).mul_(sin))


class TorchKernels:
    name = "torch"

    @staticmethod
    def fuses_qkv() -> bool:
        """Whether attention layers take the fused QK-norm + RoPE + KV-write kernel (core/kernels/fused_qkv.py)."""
        return False

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """Normalised in float32 and scaled after casting back, as transformers does."""
        dtype = x.dtype
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
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

    @staticmethod
    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               packed_weight: torch.Tensor | None) -> torch.Tensor:
        """``x @ weight.T + bias``; ``packed_weight`` is the CPU's pre-packed copy, if any (core/kernels/onednn_packed.py)."""
        return onednn_packed.linear(x, weight, bias, packed_weight)

    @classmethod
    def rms_norm_linear(cls, x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None,
                        packed_weight: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(linear(rms_norm(x + residual)), x + residual); with no residual yet, x itself is the residual."""
        if residual is None:
            residual, x = x, cls.rms_norm(x, norm_weight, eps)
        else:
            x, residual = cls.add_rms_norm(x, residual, norm_weight, eps)
        return cls.linear(x, weight, bias, packed_weight), residual

    @classmethod
    def silu_mul_linear(cls, gate_up: torch.Tensor, weight: torch.Tensor,
                        packed_weight: torch.Tensor | None) -> torch.Tensor:
        return cls.linear(cls.silu_and_mul(gate_up), weight, None, packed_weight)

    @staticmethod
    def rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, heads, dim], k: [tokens, kv_heads, dim]; rotated in their own dtype."""
        c = cos[positions].unsqueeze(1).to(q.dtype)
        s = sin[positions].unsqueeze(1).to(q.dtype)
        return _rotate(q, c, s), _rotate(k, c, s)


class FlashInferKernels(TorchKernels):
    name = "flashinfer"

    @staticmethod
    def fuses_qkv() -> bool:
        return triton_available() and not fused_qkv_disabled()

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        from flashinfer.norm import rmsnorm

        return rmsnorm(x, weight, eps)

    @classmethod
    def add_rms_norm(cls, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """In place: ``residual += x`` then ``x = rms_norm(residual)``. Both are this step's own activations."""
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

    @staticmethod
    def uses_gemv(x: torch.Tensor) -> bool:
        """One row, where the Triton kernels beat cuBLAS (and fold the norm or the activation in)."""
        return x.shape[0] <= GEMV_MAX_ROWS and triton_runs_on(x.device) and not gemv_disabled()

    @classmethod
    def linear(cls, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               packed_weight: torch.Tensor | None) -> torch.Tensor:
        if cls.uses_gemv(x):
            return gemv(x, weight, bias)
        return super().linear(x, weight, bias, packed_weight)

    @classmethod
    def rms_norm_linear(cls, x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None,
                        packed_weight: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if cls.uses_gemv(x):
            return rms_norm_gemv(x, residual, norm_weight, eps, weight, bias)
        return super().rms_norm_linear(x, residual, norm_weight, eps, weight, bias, packed_weight)

    @classmethod
    def silu_mul_linear(cls, gate_up: torch.Tensor, weight: torch.Tensor,
                        packed_weight: torch.Tensor | None) -> torch.Tensor:
        if cls.uses_gemv(gate_up):
            return silu_mul_gemv(gate_up, weight)
        return super().silu_mul_linear(gate_up, weight, packed_weight)


def install_kernels(model: nn.Module, kernels: type[TorchKernels]) -> None:
    """Point every layer that uses these kernels at one implementation."""
    for module in model.modules():
        if hasattr(module, "kernels"):
            module.kernels = kernels
