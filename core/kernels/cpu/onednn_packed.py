"""float32 linears on a CPU through oneDNN, with each weight reordered once into the blocked layout its GEMM
kernels read.

A plain ``F.linear`` goes to a BLAS sgemm that repacks the weight on every call. For a decode step's few rows
that repacking is most of the work: every weight is streamed from memory twice and the kernel runs on a
narrow panel. Packing once at load time removes that repacking (docs/BENCHMARKS.md). The
results differ from sgemm's only by float32 rounding order.

oneDNN compiles and keeps kernels for every distinct row count it sees (about 3 MB per count for
SmolLM2-135M), so a server whose prefill sizes vary would grow without a useful bound. Packed GEMMs are
therefore used for batches of at most ``PACKED_MAX_ROWS`` rows (decode steps and short prefills), where the
gain is; larger batches, which sgemm already runs near its peak, stay on ``F.linear``. The kernels for all
those row counts are compiled when the weights are packed, so memory stays flat while serving.

A single row (batch-1 decode) is a matrix-vector product. The BLAS runs it on one thread whatever torch's
thread count, oneDNN splits it over all of them; so one row goes packed only when torch has more than one
thread (``one_row``, decided in the engine's plan): on one thread the unpacked sgemv is the faster. (With two
threads on cores that other processes also keep busy, every multi-threaded call can wait for a descheduled
thread: run one thread there.)

Layers that can use it hold a ``packed`` attribute (None: plain ``F.linear``); ``pack_linears`` fills it.
The original weights stay in place (the loader, tensor-parallel slicing, large batches and the GPU path use
them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PACKED_MAX_ROWS = 32


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def min_rows(one_row: bool) -> int:
    """The fewest rows that go packed: 1, or 2 when one row stays on the BLAS's matrix-vector product."""
    return 1 if one_row else 2


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: torch.Tensor | None, one_row: bool = False) -> torch.Tensor:
    if packed is None or not min_rows(one_row) <= x.shape[0] <= PACKED_MAX_ROWS:
        if bias is None and x.dim() == 2:  # the GEMM F.linear runs here, without its two dispatch layers
            return torch.mm(x, weight.t())
        return F.linear(x, weight, bias)
    return packed_linear(x, packed, bias)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """oneDNN's GEMM on a packed weight, whatever the number of rows."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack_linears(model: nn.Module, one_row: bool) -> int:
    """Pack the weight of every layer that has an empty ``packed`` slot (one holding another form of the
    weight, e.g. int8, is left alone) and compile its kernels (for one row too with ``one_row``); returns how
    many were packed."""
    count, compiled = 0, set()
    for module in model.modules():
        if getattr(module, "packed", True) is not None:
            continue
        module.packed = pack_weight(module.weight)
        count += 1
        bias = getattr(module, "bias", None)
        shape = (tuple(module.weight.shape), bias is not None)
        if shape not in compiled:  # kernels depend on the shapes only: once per shape is enough
            compiled.add(shape)
            compile_row_counts(module.weight, bias, module.packed, one_row)
    return count


def compile_row_counts(weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor,
                       one_row: bool) -> None:
    """Run the packed GEMM once at every row count it takes, so its kernels exist before serving starts."""
    with torch.inference_mode():
        for rows in range(min_rows(one_row), PACKED_MAX_ROWS + 1):
            linear(weight.new_zeros(rows, weight.shape[1]), weight, bias, packed, one_row)
