"""bf16 copies of the linears and the LM head for prefill and batches, on a CPU with AMX (``--precision fast``
there).

AMX multiplies bf16 tiles: oneDNN's bf16 GEMM on a packed bf16 weight beats float32 from a few rows, more the
more rows (each input cast to bf16 and each output back to float32 counted in), and is no slower at one or two
rows (docs/BENCHMARKS.md). That is the prefill and the batches of the ``cpu`` workload, which float32 GEMMs bound.

Only the linears and the LM head change: each casts its float32 input to bf16 and its output back, so the
activations, the norms, attention and the KV cache stay float32, and a single request's decode steps keep running
in C on their own weights (core/kernels/cpu/decode.py). The LM head (the tied embedding's table, whose row lookup
keeps reading float32) is a large share of a batched decode step's work in float32, so it moves to bf16 too.

Which bf16 path a row count takes is the float32 rule (core/kernels/cpu/onednn_packed.py): the packed weight up to
``PACKED_MAX_ROWS`` rows, with its kernels compiled when the copy is made, the plain bf16 weight above.

The copy takes the layer's ``packed`` slot, so the float32 packing leaves the layer alone; the float32 weight
stays (the C step's int8 copies are made from it). The kernels table (core/kernels/dispatch.py) runs a linear
whose slot holds one here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.kernels.cpu import onednn_packed


@dataclass(frozen=True)
class Bf16Weight:
    """A linear's weight in bf16 [out, in] and the same in oneDNN's packed layout (``bf16_copy`` makes one)."""

    weight: torch.Tensor
    packed: torch.Tensor

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T + bias`` in bf16 products, x and the result float32."""
        out = onednn_packed.linear(x.to(torch.bfloat16), self.weight, None, self.packed, one_row=True).float()
        return out if bias is None else out.add_(bias)


def bf16_copy(weight: torch.Tensor) -> Bf16Weight:
    """A float32 weight's bf16 copy, packed."""
    bf16 = weight.detach().to(torch.bfloat16).contiguous()
    return Bf16Weight(bf16, onednn_packed.pack_weight(bf16))


def bf16_linears(model: nn.Module) -> int:
    """Give every linear with a ``packed`` slot (the decoder's and the LM head) its bf16 copy, once, at load, and
    compile the packed kernels for each row count (once per shape); returns how many."""
    layers = [module for module in model.modules() if hasattr(module, "packed")]
    compiled = set()
    for module in layers:
        module.packed = bf16_copy(module.weight)
        shape = tuple(module.weight.shape)
        if shape not in compiled:
            compiled.add(shape)
            onednn_packed.compile_row_counts(module.packed.weight, None, module.packed.packed, one_row=True)
    return len(layers)
