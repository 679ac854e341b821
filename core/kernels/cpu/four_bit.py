"""Float32 weights that are 4-bit codes in disguise, found and repacked for the C kernels.

A Q4_1 GGUF stores each block of 32 inputs of a weight row as 4-bit codes q with a float16 scale d and offset m,
and dequantises to float32 as d * q + m: an exact product (an 11-bit mantissa times four bits) and one rounding.
The embedded SmolLM2's linears arrive that way, as 540 MB of float32 that hold about 5 bits of information per
weight. The C GEMM (core/kernels/cpu/gemm.c) and the C decode step (core/kernels/cpu/decode.c) can read the codes
with each block's d and m instead and expand them with one fused multiply-add per weight, the same single
rounding: the very floats, so every product is bit-identical, from a fifth of the bytes. ``q4_codes`` finds the
codes from the floats alone (no GGUF needed) and checks every weight, so a weight that is not of that form simply
stays float32.
"""

from __future__ import annotations

import torch
from torch import nn

from core.kernels.derived import DerivedCache

Q4_BLOCK = 32  # inputs per block of codes, as in a Q4_1 GGUF and in both C files
# what the C kernels read per weight in that form: half a byte of code, and d and m (float32) per 32
BYTES_PER_WEIGHT = 0.5 + 8 / Q4_BLOCK


Q4Codes = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # codes uint8 [n, k], d and m float32 [n, k / 32]


def q4_codes(weight: torch.Tensor) -> Q4Codes | None:
    """(codes uint8 [n, k], d and m float32 [n, k / 32]) with weight == d * codes + m exactly, block by block of
    32 inputs, or None where some block is not of that form. m is a block's smallest weight (code 0), d its range
    over 15 rounded to float16 (a GGUF's d is a float16); every weight is then checked bit for bit."""
    weight = weight.detach()
    n, k = weight.shape
    if k % Q4_BLOCK or weight.dtype != torch.float32:
        return None
    if n > 1 and _codes_of(weight[:1]) is None:  # most weights are not codes: the first row tells at once
        return None
    return _codes_of(weight)


def _codes_of(weight: torch.Tensor) -> Q4Codes | None:
    n, k = weight.shape
    blocks = weight.reshape(n, k // Q4_BLOCK, Q4_BLOCK)
    low, high = blocks.amin(-1), blocks.amax(-1)
    d = ((high - low) / 15).half().float()
    codes = torch.where(d[..., None] > 0, ((blocks - low[..., None]) / d[..., None]).round(), 0).clamp(0, 15)
    if not torch.equal(d[..., None] * codes + low[..., None], blocks):
        return None
    return codes.to(torch.uint8).reshape(n, k), d.contiguous(), low.contiguous()


def linear_codes(model: nn.Module, cache: DerivedCache | None = None) -> dict[nn.Module, Q4Codes]:
    """Every linear (a layer with a ``packed`` slot) whose weight is made of codes, with its codes: found once for
    both C kernels that read them, when the engine is built (or read back from ``cache``, by the layer's name)."""
    cache = cache or DerivedCache()
    found = {}
    for name, module in model.named_modules():
        if getattr(module, "packed", True) is None:
            codes = cache.get(f"q4_codes:{name}", lambda: q4_codes(module.weight))
            if codes is not None:
                found[module] = codes
    return found


def q4_rows(codes: Q4Codes) -> torch.Tensor:
    """The codes as the C decode step reads 4-bit rows (decode.c's Weight.q4): [n, k / 32, 24] bytes, per
    block 16 bytes of codes (input j low nibble, input j + 16 high) then d and m as float32."""
    codes, d, m = codes
    n, k = codes.shape
    blocks = codes.reshape(n, k // Q4_BLOCK, Q4_BLOCK)
    packed = blocks[..., :Q4_BLOCK // 2] | (blocks[..., Q4_BLOCK // 2:] << 4)
    scales = torch.stack([d, m], dim=-1).contiguous().view(torch.uint8)  # [n, blocks, 8]
    return torch.cat([packed, scales], dim=-1).contiguous()
