"""The one place that reads environment variables (MINISGL_*, and where the Hugging Face cache is), so every
knob is discoverable here.

The MINISGL_DISABLE_* switches are read once, when an engine is built, into its plan (core/engine/plan.py).
"""

from __future__ import annotations

import os
from pathlib import Path


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def home_dir() -> Path:
    """Where converted models are cached: $MINISGL_HOME, else ~/.cache/minisgl."""
    root = os.environ.get("MINISGL_HOME")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "minisgl"


def hf_hub_cache() -> Path:
    """The local Hugging Face hub cache where ``--model ORG/NAME`` is looked up (never downloaded into):
    $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub, as huggingface_hub lays it out."""
    hub = os.environ.get("HF_HUB_CACHE")
    if hub:
        return Path(hub).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface") / "hub"


def derived_cache_disabled() -> bool:
    """MINISGL_DISABLE_DERIVED_CACHE=1 derives the kernels' tensors from the weights on every start instead of
    reading them back from MINISGL_HOME (core/kernels/derived.py; for comparisons)."""
    return _flag("MINISGL_DISABLE_DERIVED_CACHE")


def overlap_scheduling_disabled() -> bool:
    """MINISGL_DISABLE_OVERLAP_SCHEDULING=1 forces the plain receive/forward/handle loop."""
    return _flag("MINISGL_DISABLE_OVERLAP_SCHEDULING")


def tp_timeout_s() -> float:
    """MINISGL_TP_TIMEOUT: seconds a tensor-parallel collective may wait for a silent rank (default 120).

    A worker that dies is noticed at once through its process sentinel; this bounds the wait for one that hangs.
    """
    raw = os.environ.get("MINISGL_TP_TIMEOUT", "").strip()
    try:
        value = float(raw) if raw else 120.0
    except ValueError:
        value = -1.0
    if not value > 0:
        from core.errors import InvalidParamsError

        raise InvalidParamsError(f"MINISGL_TP_TIMEOUT must be a number of seconds > 0, got {raw!r}")
    return value


def fused_qkv_disabled() -> bool:
    """MINISGL_DISABLE_FUSED_QKV=1 runs QK-norm, RoPE and the KV write as separate kernels (for comparisons)."""
    return _flag("MINISGL_DISABLE_FUSED_QKV")


def small_decode_disabled() -> bool:
    """MINISGL_DISABLE_SMALL_DECODE=1 keeps flashinfer's decode kernels for small captured batches instead of
    the one-kernel Triton decode (see core/kernels/cuda/small_decode.py; for comparisons)."""
    return _flag("MINISGL_DISABLE_SMALL_DECODE")


def pdl_disabled() -> bool:
    """MINISGL_DISABLE_PDL=1 launches the batch-1 Triton kernels as plain launches instead of programmatic
    dependent ones (see KernelChoices.pdl; for comparisons)."""
    return _flag("MINISGL_DISABLE_PDL")


def triton_sampler_disabled() -> bool:
    """MINISGL_DISABLE_TRITON_SAMPLER=1 draws sampled tokens on CUDA with torch.compile's exponential race
    instead of the Triton race kernels (core/kernels/cuda/race.py; the same tokens; for comparisons)."""
    return _flag("MINISGL_DISABLE_TRITON_SAMPLER")


def whole_request_decode_disabled() -> bool:
    """MINISGL_DISABLE_WHOLE_REQUEST_DECODE=1 keeps flashinfer's split of the tensor-core decode under CUDA
    graphs even where its plan gives every request one chunk (float32 partials and a merge kernel a layer; see
    core/kernels/cuda/attention/flashinfer_paged.py, ``whole_request_rows``; for comparisons)."""
    return _flag("MINISGL_DISABLE_WHOLE_REQUEST_DECODE")


def prefill_graph_disabled() -> bool:
    """MINISGL_DISABLE_PREFILL_GRAPH=1 runs every prefill chunk eagerly instead of replaying the captured graph of a
    full chunk (core/kernels/cuda/graphs/prefill.py; for comparisons)."""
    return _flag("MINISGL_DISABLE_PREFILL_GRAPH")


def head_major_kv_disabled() -> bool:
    """MINISGL_DISABLE_HEAD_MAJOR_KV=1 keeps a bf16 pool under flashinfer attention token-major (NHD) instead of
    head-major (HND: each page one KV head's tokens side by side; core/kvcache/pool.py; for comparisons)."""
    return _flag("MINISGL_DISABLE_HEAD_MAJOR_KV")


DEFAULT_SPLIT_K = 2


def split_k_slices() -> int:
    """MINISGL_SPLIT_K=S (an integer from 0 to 16, default 2) runs the narrow linears (o_proj, down) of decode steps
    on CUDA as S slices of their inputs (at least 4 up to 128 rows: split_k.slices_for), the sum folded into the
    add+RMSNorm after them (core/kernels/cuda/split_k.py); 0 runs each as one cuBLAS GEMM. A narrow linear's few
    output tiles leave most SMs idle; slices give them work (docs/BENCHMARKS.md)."""
    raw = os.environ.get("MINISGL_SPLIT_K", "").strip()
    if not raw:
        return DEFAULT_SPLIT_K
    if not raw.isdigit() or int(raw) > 16:
        from core.errors import InvalidParamsError

        raise InvalidParamsError(f"MINISGL_SPLIT_K must be a number of slices from 0 to 16, got {raw!r}")
    return int(raw)


DEFAULT_TENSOR_CORE_DECODE_ROWS = 1


def tensor_core_decode_rows() -> int:
    """MINISGL_TENSOR_CORE_DECODE_ROWS=N (default 1: every size): bf16 decode batches of at least N rows run
    flashinfer's tensor-core (prefill-style) decode instead of its plain one; 0 keeps the plain kernel throughout
    (a model with 4 or more query heads per KV head takes tensor cores at every size, flashinfer's advice). At a
    real workload's mixed lengths the tensor-core decode is level with the plain one on small batches and faster
    on large ones, even at 2 query heads per KV head (docs/BENCHMARKS.md)."""
    raw = os.environ.get("MINISGL_TENSOR_CORE_DECODE_ROWS", "").strip()
    if not raw:
        return DEFAULT_TENSOR_CORE_DECODE_ROWS
    if not raw.isdigit():
        from core.errors import InvalidParamsError

        raise InvalidParamsError(f"MINISGL_TENSOR_CORE_DECODE_ROWS must be a number of rows (0: never), got {raw!r}")
    return int(raw)


def cuda_fp8_decode_disabled() -> bool:
    """MINISGL_DISABLE_CUDA_FP8_DECODE=1 decodes an fp8 KV cache with the Triton paged kernel instead of the CUDA
    one (core/kernels/cuda/fp8_decode.py; for comparisons)."""
    return _flag("MINISGL_DISABLE_CUDA_FP8_DECODE")


def gemv_disabled() -> bool:
    """MINISGL_DISABLE_GEMV=1 runs small-batch linears on cuBLAS, with the norms and activations as kernels of
    their own (see core/kernels/cuda/gemv.py; for comparisons)."""
    return _flag("MINISGL_DISABLE_GEMV")


def cpu_weight_packing_disabled() -> bool:
    """MINISGL_DISABLE_CPU_WEIGHT_PACKING=1 keeps float32 CPU linears on plain F.linear (see core/kernels/cpu/onednn_packed.py)."""
    return _flag("MINISGL_DISABLE_CPU_WEIGHT_PACKING")


def four_bit_weights_disabled() -> bool:
    """MINISGL_DISABLE_FOUR_BIT_WEIGHTS=1 has the C GEMM and the C decode step read float32 weights as float32 even
    where they are 4-bit codes (a Q4_1 GGUF's linears; the same products either way, for comparisons)."""
    return _flag("MINISGL_DISABLE_FOUR_BIT_WEIGHTS")


def screened_head_disabled() -> bool:
    """MINISGL_DISABLE_SCREENED_HEAD=1 computes a greedy step's whole LM head instead of screening it through an
    int8 copy (on a CPU core/kernels/cpu/screened_head.py, on CUDA core/kernels/cuda/screened_head.py; the same tokens,
    for comparisons)."""
    return _flag("MINISGL_DISABLE_SCREENED_HEAD")


def cpu_gemm_disabled() -> bool:
    """MINISGL_DISABLE_CPU_GEMM=1 keeps float32 CPU linears on oneDNN's packed GEMM instead of the C GEMM
    (core/kernels/cpu/gemm.py; for comparisons)."""
    return _flag("MINISGL_DISABLE_CPU_GEMM")


def cpu_decode_disabled() -> bool:
    """MINISGL_DISABLE_CPU_DECODE=1 keeps single-request decode steps on torch instead of the C step, and a CPU
    batch's decode attention on SDPA (core/kernels/cpu/decode.py, core/kernels/cpu/attention.py; for comparisons)."""
    return _flag("MINISGL_DISABLE_CPU_DECODE")


def int8_dots_disabled() -> bool:
    """MINISGL_DISABLE_INT8_DOTS=1 keeps the int8 C decode step's inputs in float32 (each int8 weight widened to
    float32 for an FMA) instead of quantising them for integer dot products (for comparisons)."""
    return _flag("MINISGL_DISABLE_INT8_DOTS")
