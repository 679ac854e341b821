"""Every switch of the engine, decided once when it is built.

A switch has three sources: the config (``None`` meaning "choose for this machine"), the ``MINISGL_DISABLE_*``
variables (read in core/env.py, for comparisons) and what this machine can run (CUDA, flashinfer, Triton,
oneDNN). They are resolved here into one frozen ``EnginePlan``; the engine builds its attention backend, its
kernels, its CUDA graphs and its one-line description from it, and the scheduler its loop. Because the CUDA-graph
plan and the layers' path read the same record, they cannot disagree, and no forward pass decides again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core import env
from core.kernels.cuda.attention.flashinfer_common import HALF_DTYPES, flashinfer_available
from core.config import EngineConfig
from core.cpu_share import engine_threads
from core.distributed.info import get_tp_info
from core.errors import InvalidParamsError
from core.kernels.choices import KernelChoices
from core.kernels.cpu.features import cpu_features
from core.kernels.cpu.precision import PrecisionChoice, c_attention_runs, c_gemm_unavailable, plan_cpu_precision
from core.kernels.cpu.screened_head import unsupported_reason as screen_unsupported
from core.kernels.cpu.onednn_packed import packing_available
from core.kernels.cuda.plan import (AttentionShape, dependent_launch_runs_on, fp8_cuda_decode_runs, graph_max_bs,
                                    head_major_kv_runs, prefill_graph_runs, tensor_core_decode_rows)
from core.kernels.cuda.triton_available import triton_runs_on

@dataclass(frozen=True)
class EnginePlan:
    attention: str  # "flashinfer" or "torch"
    kv_fp8: bool  # the KV pool stores e4m3 with per-head scales (core/kvcache/pool.py)
    # fp8 KV on CUDA with torch attention: decode reads the fp8 pages in place with the Triton paged kernel
    # (core/kernels/cuda/paged_decode.py; the flashinfer backend runs the same kernel for an fp8 pool, under graphs)
    fp8_paged_decode: bool
    kernels: KernelChoices
    cuda_graph_max_bs: int  # decode batches up to this size replay captured graphs; 0: every step runs eagerly
    overlap: bool  # prepare step N+1 while step N runs
    precision: PrecisionChoice  # the weights' form and the dtype the model runs in
    # torch attention's decode steps in one C call per layer over a float32 CPU pool
    # (core/kernels/cpu/attention.py) instead of a gather and a masked SDPA
    c_attention: bool = False
    # an fp8 pool's decode steps under flashinfer attention on the CUDA kernel (core/kernels/cuda/fp8_decode.py)
    # instead of the Triton paged kernel, where nvcc builds it for this GPU and it takes the model's heads
    fp8_cuda_decode: bool = False
    # bf16 decode batches of at least this many rows on flashinfer's tensor-core decode (0: the plain one; a model
    # with 4+ query heads per KV head takes tensor cores at every size, 1); only under flashinfer attention on a
    # bf16 pool
    tensor_core_decode_rows: int = 0
    # from the batch size where flashinfer's tensor-core decode plan gives each request one KV chunk, plan it
    # unsplit (no float32 partials, no merge kernel); only under flashinfer attention on a bf16 pool
    whole_request_decode: bool = False
    # a prefill chunk replays the smallest captured graph that holds it (core/kernels/cuda/graphs/prefill.py)
    prefill_graph: bool = False
    # the KV pool head-major (flashinfer's HND: each page one KV head's tokens side by side), which decode reads
    # faster at large pages (core/kvcache/pool.py); else token-major, what every other reader takes
    head_major_kv: bool = False
    # the CPU threads this rank computes on (core/cpu_share.py): torch's, and the C kernels' with them
    threads: int = 1


def overlap_enabled(config: EngineConfig, device: torch.device) -> bool:
    """On for CUDA, off on a CPU (where it gains nothing but runs the same bookkeeping), unless the config says;
    MINISGL_DISABLE_OVERLAP_SCHEDULING=1 turns it off regardless."""
    if env.disabled("OVERLAP_SCHEDULING"):
        return False
    return config.overlap if config.overlap is not None else device.type == "cuda"


# the head dims flashinfer's prefill and decode kernels compile for on every CUDA card (its sm90 prefill builds no
# other); the tests' CPU stand-in for flashinfer takes any
FLASHINFER_HEAD_DIMS = (64, 128, 256)


def attention_name(config: EngineConfig, device: torch.device, dtype: torch.dtype,
                   head_dim: int | None = None) -> str:
    """flashinfer when asked, or by default on CUDA in bf16/fp16 when it imports and its kernels are built for the
    model's head dim (with an fp8 KV cache, also only where Triton runs); torch otherwise."""
    head_dim_fits = head_dim is None or head_dim in FLASHINFER_HEAD_DIMS or device.type != "cuda"
    if config.attention is not None:
        if config.attention == "flashinfer" and not flashinfer_available():
            raise InvalidParamsError("the flashinfer attention backend needs the flashinfer-python package "
                                     "(pip install 'minisgl[cuda]'); or use --attention torch")
        if config.attention == "flashinfer" and not head_dim_fits:
            raise InvalidParamsError(f"flashinfer's attention kernels are built for head dims "
                                     f"{', '.join(map(str, FLASHINFER_HEAD_DIMS))}; this model's is {head_dim}: "
                                     "use --attention torch")
        if config.attention == "flashinfer" and config.kv_dtype == "fp8" and not triton_runs_on(device):
            raise InvalidParamsError("an fp8 KV cache with the flashinfer attention backend decodes with a Triton "
                                     "kernel, and Triton does not run here; use --attention torch")
        return config.attention
    if config.kv_dtype == "fp8" and not triton_runs_on(device):  # flashinfer's kernels take no per-head scales:
        return "torch"  # its backend decodes fp8 pages with the Triton paged kernel
    if device.type == "cuda" and dtype in HALF_DTYPES and head_dim_fits and flashinfer_available():
        return "flashinfer"
    return "torch"


def kernel_choices(attention: str, device: torch.device, dtype: torch.dtype,
                   int8_weights: bool = False, kv_fp8: bool = False, bf16_linears: bool = False,
                   threads: int = 1) -> KernelChoices:
    """flashinfer's kernel set exactly with flashinfer attention, its Triton kernels where Triton runs (each one
    can be turned off for comparisons; the small-batch decode reads bf16 pages only, so not with an fp8 KV
    cache); on a float32 CPU the C GEMM's panels where it runs (AVX-512; not beside bf16 copies, which take every
    linear), with VNNI also a greedy batch's LM head screened through int8, else oneDNN-packed weights, used at
    one row too when the engine runs more than one thread."""
    flashinfer = attention == "flashinfer"
    triton = flashinfer and triton_runs_on(device)
    fused_qkv = triton and not env.disabled("FUSED_QKV")
    features = cpu_features()
    c_gemm = not bf16_linears and not c_gemm_unavailable(device, dtype, features)
    screened_head = c_gemm and not screen_unsupported(features.flags) and not env.disabled("SCREENED_HEAD")
    packed = packing_available(device, dtype) and not env.disabled("CPU_WEIGHT_PACKING") and not c_gemm
    gemv = triton and not env.disabled("GEMV")
    small_decode = fused_qkv and not kv_fp8 and not env.disabled("SMALL_DECODE")
    return KernelChoices(
        flashinfer=flashinfer, fused_qkv=fused_qkv, gemv=gemv, small_decode=small_decode,
        pdl=(gemv or small_decode) and dependent_launch_runs_on(device) and not env.disabled("PDL"),
        triton_sampler=triton and not env.disabled("TRITON_SAMPLER"), fp8_gather=triton and kv_fp8,
        split_k=env.split_k_slices() if triton and not c_gemm else 0,  # the panels' norm takes no partial sums
        packed_weights=packed, packed_one_row=packed and threads > 1, c_gemm=c_gemm,
        four_bit_weights=(device.type == "cpu" and dtype == torch.float32 and not int8_weights and not bf16_linears
                          and not env.disabled("FOUR_BIT_WEIGHTS")),
        screened_head=screened_head, gpu_screened_head=gemv and not env.disabled("SCREENED_HEAD"),
        int8_weights=int8_weights, bf16_linears=bf16_linears)


def plan_engine(config: EngineConfig, device: torch.device, dtype: torch.dtype,
                heads: AttentionShape | None = None) -> EnginePlan:
    """``dtype`` is the one asked for (or the device's default); the engine runs in ``plan.precision.dtype``
    (the same: the precisions change the weights' form, not the activations'). ``heads``: one rank's attention
    heads (the engine gives them), for the kernels that take only some."""
    precision = plan_cpu_precision(config, device, dtype)
    dtype = precision.dtype
    attention = attention_name(config, device, dtype, heads.head_dim if heads is not None else None)
    kv_fp8 = config.kv_dtype == "fp8"
    graph_bs = graph_max_bs(config, device, attention)
    threads = engine_threads(config.threads, get_tp_info().size, torch.get_num_threads())
    return EnginePlan(
        attention=attention, kv_fp8=kv_fp8,
        fp8_paged_decode=kv_fp8 and attention == "torch" and device.type == "cuda" and triton_runs_on(device),
        kernels=kernel_choices(attention, device, dtype, precision.int8_weights, kv_fp8, precision.bf16_linears,
                               threads),
        cuda_graph_max_bs=graph_bs,
        overlap=overlap_enabled(config, device), precision=precision,
        c_attention=c_attention_runs(device, dtype, attention, kv_fp8),
        fp8_cuda_decode=fp8_cuda_decode_runs(device, attention, kv_fp8, dtype, heads),
        tensor_core_decode_rows=tensor_core_decode_rows(attention, kv_fp8, heads),
        whole_request_decode=attention == "flashinfer" and not kv_fp8 and not env.disabled("WHOLE_REQUEST_DECODE"),
        prefill_graph=prefill_graph_runs(config, attention, graph_bs, kv_fp8),
        head_major_kv=head_major_kv_runs(attention, kv_fp8, precision.c_decode), threads=threads)
