"""Putting a checkpoint tensor into a parameter: adopted as it is when it is the whole parameter, else copied.

A tensor read from safetensors on the CPU is a copy-on-write map of the file: adopting it loads the weight without
a copy, its pages are read when first used (a linear that runs on panels or 4-bit codes made elsewhere may never
read them), and writing to it changes the process's copy, never the file.
"""

from __future__ import annotations

import torch


def fill(param: torch.nn.Parameter, source: torch.Tensor, offset: int = 0) -> None:
    """Rows ``offset`` onwards of ``param`` become ``source``: the very tensor when it has the parameter's whole
    shape, dtype and device and is contiguous, a copy into place otherwise (a slice, a fused block, a cast)."""
    whole = (offset == 0 and source.shape == param.shape and source.dtype == param.dtype
             and source.device == param.device and source.is_contiguous())
    if whole:
        param.data = source
    else:
        param.data[offset:offset + source.shape[0]].copy_(source)
