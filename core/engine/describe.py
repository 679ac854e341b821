"""The engine in words: what its plan chose, for ``Engine.describe`` and ``Engine.summary``."""

from __future__ import annotations

from core.config import EngineConfig
from core.engine.kv_budget import MemoryPlan, kv_budget_gb
from core.engine.plan import EnginePlan
from core.kernels.cuda.split_k import FEW_ROWS, slices_for


def weight_words(plan: EnginePlan, four_bit: int, screened_head: bool) -> str:
    """", linears in C on weights packed into panels (AVX-512), ...": the weights' other forms the plan chose
    (``four_bit``: how many panels are 4-bit codes; ``screened_head``: whether the LM head screens greedy rows)."""
    packed = ((", linears in C on weights packed into panels (AVX-512" +
               (f"; {four_bit} of them as the 4-bit codes they are made of)" if four_bit else ")"))
              if plan.kernels.c_gemm else
              ", weights packed for the CPU's matrix library" if plan.kernels.packed_weights else "")
    if screened_head:
        packed += (", greedy batches' LM head screened through int8 (VNNI)" if plan.kernels.screened_head else
                   ", a greedy request's LM head screened through int8")
    if plan.precision.words:
        packed += f", {plan.precision.words}"
    return packed


def kernel_words(plan: EnginePlan) -> str:
    """"torch kernels", or flashinfer's with the Triton kernels the plan turned on."""
    kernels = plan.kernels
    fused = [what for on, what in ((kernels.fused_qkv, "fused QKV"), (kernels.gemv, "batch-1 GEMV"),
                                   (kernels.small_decode and plan.cuda_graph_max_bs, "small-batch decode"),
                                   (kernels.pdl, "dependent launches"), (kernels.triton_sampler, "Triton sampler"),
                                   (plan.c_attention, "decode attention in C"),
                                   (plan.fp8_cuda_decode, "CUDA fp8 decode"),
                                   (kernels.split_k, split_k_words(kernels.split_k)),
                                   (plan.tensor_core_decode_rows,
                                    "tensor-core decode" + (f" from {plan.tensor_core_decode_rows} rows"
                                                            if plan.tensor_core_decode_rows > 1 else "")))
             if on]
    return f"{kernels.name} kernels" + (f" ({', '.join(fused)})" if fused else "")


def split_k_words(slices: int) -> str:
    """"split-K x2 (x4 up to 128 rows)": the slices of the narrow linears, by rows (core/kernels/cuda/split_k.py)."""
    few = slices_for(1, slices)
    return f"split-K x{slices}" + (f" (x{few} up to {FEW_ROWS} rows)" if few != slices else "")


def size_words(num_bytes: int) -> str:
    """In the largest unit that reads as at least 1.0 (a pool a hair under 1 GiB is '1.0 GiB', not '1024.0 MiB')."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= 0.95 * scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} bytes"


def budget_words(config: EngineConfig, memory: MemoryPlan | None) -> str:
    """Why the KV pool has the size it has when a budget of memory set it: as asked, or what the card's memory plan
    left it ("the 55.1 GiB left of 62.0 GiB free after 2.2 GiB for the graphs, screen and workspace and a 6.2
    GiB reserve")."""
    budget = kv_budget_gb(config, memory)
    if config.kv_cache_gb or memory is None:
        return f"the {budget:.1f} GiB budget for the cache"
    gib = 1 << 30
    return (f"the {budget:.1f} GiB left of {memory.free / gib:.1f} GiB free after {memory.counted / gib:.1f} GiB for "
            f"the graphs, screen and workspace and a {memory.reserve / gib:.1f} GiB reserve")
