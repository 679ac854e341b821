"""The small per-token kernels (RMSNorm, residual add + RMSNorm, SiLU-and-mul, RoPE), chosen in one place.

``TorchKernels`` is plain torch and runs anywhere; in float32 it matches transformers bit for bit.
``FlashInferKernels`` swaps in flashinfer's fused CUDA kernels (one launch instead of several, no float32
intermediates in memory), in bf16/fp16 on CUDA. Layers hold a ``kernels`` attribute, set for the whole model
by ``install_kernels``; the engine picks flashinfer's set exactly when it runs flashinfer attention, so
``attention='torch'`` runs the whole model in plain torch, the reference to compare against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.env import fused_qkv_disabled
from core.layers.fused_qkv import fused_qkv_available


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
        """Whether attention layers take the fused QK-norm + RoPE + KV-write kernel (core/layers/fused_qkv.py)."""
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
        return fused_qkv_available() and not fused_qkv_disabled()

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


def install_kernels(model: nn.Module, kernels: type[TorchKernels]) -> None:
    """Point every layer that uses these kernels at one implementation."""
    for module in model.modules():
        if hasattr(module, "kernels"):
            module.kernels = kernels
