"""int8 weight-only linears on a CPU: each weight stored as int8 with one float32 scale per output row.

What ``--precision int8`` runs on torch where the C decode step does not run (core/engine/plan.py): a decode
step reads a quarter of the weight bytes of float32. Activations, the KV cache, norms and the LM head stay
float32; only the decoder's linears change, so the outputs are close to float32's, not equal.

Quantisation is symmetric per output channel: ``scale = max|w_row| / 127``, ``q = round(w / scale)``; the
largest error of one weight is half a scale. Up to ``INT8_MM_MAX_ROWS`` rows (decode steps, short prefills)
torch's ``_weight_int8pack_mm`` multiplies with the int8 weight directly; larger batches are bound by compute,
not by reading the weights, and there the weight is widened to float32 for one sgemm.

Where the C decode step runs (AVX2 and FMA), ``--precision int8`` and ``fast`` leave the torch layers float32
and give the C step int8 copies made with ``Int8Weight.quantize``: torch's int8 kernel ran batches at a fifth of
float32's speed on an AVX2 CPU and an eighth on an AVX-512 one (core/engine/plan.py).

The quantised weight takes the layer's ``packed`` slot (see core/kernels/cpu/onednn_packed.py) and the float32
weight is freed; the kernels table (core/kernels/dispatch.py) runs a linear whose slot holds one here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

INT8_MM_MAX_ROWS = 32
INT8_MAX = 127
QUANTIZE_BLOCK_ELEMENTS = 1 << 24  # weights quantised at once: 64 MB of float32 temporaries each


@dataclass(frozen=True)
class Int8Weight:
    """A linear's weight as int8 [out, in] and its float32 scale per output row [out]."""

    values: torch.Tensor
    scales: torch.Tensor

    @classmethod
    def quantize(cls, weight: torch.Tensor, block_elements: int = QUANTIZE_BLOCK_ELEMENTS) -> "Int8Weight":
        """Block by block of rows (``block_elements`` weights at a time): the float32 temporaries of a whole
        LM head would take several times its size beside it (a GPU's KV pool has left little more than the copy)."""
        rows, cols = weight.shape
        values = torch.empty(rows, cols, dtype=torch.int8, device=weight.device)
        scales = torch.empty(rows, dtype=torch.float32, device=weight.device)
        step = max(1, block_elements // max(cols, 1))
        for start in range(0, rows, step):
            w = weight[start:start + step].detach().float()
            block_scales = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / INT8_MAX
            values[start:start + step] = torch.round(w / block_scales[:, None]).clamp_(-INT8_MAX, INT8_MAX)
            scales[start:start + step] = block_scales
        return cls(values, scales)

    def dequantize(self) -> torch.Tensor:
        return self.values.float() * self.scales[:, None]

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return int8_linear(x, self, bias)


def int8_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ dequantize(weight).T + bias`` with x in float32."""
    if x.shape[0] <= INT8_MM_MAX_ROWS:
        out = torch.ops.aten._weight_int8pack_mm(x, weight.values, weight.scales)
    else:
        out = F.linear(x, weight.values.float()) * weight.scales
    return out if bias is None else out.add_(bias)


def decoder_linears(model: nn.Module) -> list[nn.Module]:
    """The layers quantised: every layer with a ``packed`` slot and a weight of its own. That leaves out the LM
    head, whose weight is the embedding's (tied) or its inner table's: it stays float32, as its logits decide
    the greedy token."""
    return [m for m in model.modules()
            if hasattr(m, "packed") and "weight" in dict(m.named_parameters(recurse=False))]


def quantize_linears(model: nn.Module) -> int:
    """Quantise every decoder linear once, at load, freeing its float32 weight; returns how many."""
    layers = decoder_linears(model)
    for module in layers:
        module.packed = Int8Weight.quantize(module.weight)
        module.weight.data = module.weight.data.new_empty(0)
    return len(layers)
