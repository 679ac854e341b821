"""The one place that reads environment variables (MINISGL_*, and where the Hugging Face cache is), so every
knob is discoverable here."""

from __future__ import annotations

import os
from pathlib import Path

from core.errors import InvalidParamsError


def home_dir() -> Path:
    """Where converted models are cached: $MINISGL_HOME, else ~/.cache/minisgl."""
    root = os.environ.get("MINISGL_HOME")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "minisgl"


def hf_hub_cache() -> Path:
    """The local Hugging Face hub cache where ``--model ORG/NAME`` is looked up (never downloaded into):
    $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub, as huggingface_hub lays it out."""
    if hub := os.environ.get("HF_HUB_CACHE"):
        return Path(hub).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface") / "hub"


# Each MINISGL_DISABLE_<NAME>=1 turns one fast path off, so it can be compared against the path without it (the
# tokens stay the same); the plan reads them once, when an engine is built.
FAST_PATH_SWITCHES: dict[str, str] = {
    "OVERLAP_SCHEDULING": "the plain receive/forward/handle loop instead of preparing step N+1 while step N runs",
    "FUSED_QKV": "QK-norm, RoPE and the KV write as separate kernels (core/kernels/cuda/fused_qkv.py)",
    "SMALL_DECODE": "flashinfer's decode kernels for small captured batches, not the one-kernel Triton decode",
    "PDL": "the batch-1 Triton kernels as plain launches, not programmatic dependent ones (KernelChoices.pdl)",
    "TRITON_SAMPLER": "torch.compile's exponential race for sampled tokens on CUDA, not core/kernels/cuda/race.py",
    "WHOLE_REQUEST_DECODE": "flashinfer's split of the graphed tensor-core decode even where a request is one chunk",
    "PREFILL_GRAPH": "every prefill chunk eagerly, not the captured graph of a full chunk",
    "HEAD_MAJOR_KV": "a bf16 pool under flashinfer attention token-major (NHD), not head-major (HND)",
    "CUDA_FP8_DECODE": "an fp8 KV cache decoded by the Triton paged kernel, not the CUDA one",
    "GEMV": "small-batch CUDA linears on cuBLAS, norms and activations as kernels of their own",
    "CPU_WEIGHT_PACKING": "float32 CPU linears on plain F.linear (core/kernels/cpu/onednn_packed.py)",
    "FOUR_BIT_WEIGHTS": "float32 weights read as float32 even where they are 4-bit codes (a Q4_1 GGUF's linears)",
    "SCREENED_HEAD": "a greedy step's whole LM head, not screened through an int8 copy",
    "CPU_GEMM": "float32 CPU linears on oneDNN's packed GEMM, not the C GEMM (core/kernels/cpu/gemm.py)",
    "CPU_DECODE": "single-request CPU decode steps on torch, not one C call, and batch decode attention on SDPA",
    "INT8_DOTS": "the int8 C decode step's inputs kept in float32, not quantised for integer dot products",
    "DERIVED_CACHE": "what the kernels derive from the weights derived on every start, not read back from MINISGL_HOME",
}


def disabled(name: str) -> bool:
    """Whether MINISGL_DISABLE_<name> is set (``name`` a key of FAST_PATH_SWITCHES)."""
    assert name in FAST_PATH_SWITCHES, f"no fast-path switch {name!r}"
    return os.environ.get(f"MINISGL_DISABLE_{name}", "").strip().lower() in {"1", "true", "yes", "on"}


# How many times an idle OpenMP worker (torch's, and the C kernels', which share its pool) spins at a barrier
# before it sleeps, on a machine that other processes keep busy. libgomp counts about 100,000 spins a millisecond:
# its default, 300,000, keeps a worker spinning some 3 ms after each barrier, the fastest on an idle machine, but
# beside other busy processes the spinning worker spends the CPU time the thread it waits for needs, and a step's
# barriers wait for whole scheduler slices. 1,000 is some 10 us. docs/BENCHMARKS.md ("A busy machine") has both.
IDLE_SPINS = "1000"


def let_idle_threads_sleep(busy: bool) -> None:
    """On a ``busy`` machine, set GOMP_SPINCOUNT to IDLE_SPINS, unless GOMP_SPINCOUNT or OMP_WAIT_POLICY is set
    already (the user's word wins); an idle one keeps libgomp's default. libgomp reads it once, when torch loads
    it, so core/__init__.py calls this before anything imports torch; a program that imports torch before
    minisgl keeps libgomp's default."""
    if busy and "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = IDLE_SPINS


def tp_timeout_s() -> float:
    """MINISGL_TP_TIMEOUT: seconds a tensor-parallel collective may wait for a silent rank (default 120). A worker
    that dies is noticed at once through its process sentinel; this bounds the wait for one that hangs."""
    raw = os.environ.get("MINISGL_TP_TIMEOUT", "").strip()
    try:
        value = float(raw) if raw else 120.0
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidParamsError(f"MINISGL_TP_TIMEOUT must be a number of seconds > 0, got {raw!r}")
    return value


def _count(name: str, default: int, most: int, what: str) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) > most:
        raise InvalidParamsError(f"{name} must be {what}, got {raw!r}")
    return int(raw)


def split_k_slices() -> int:
    """MINISGL_SPLIT_K=S (0 to 16, default 2) runs the narrow linears (o_proj, down) of CUDA decode steps as S slices
    of their inputs, the sum folded into the add+RMSNorm after them (core/kernels/cuda/split_k.py); 0 runs each as
    one cuBLAS GEMM. A narrow linear's few output tiles leave most SMs idle; slices give them work."""
    return _count("MINISGL_SPLIT_K", 2, 16, "a number of slices from 0 to 16")


def tensor_core_decode_rows() -> int:
    """MINISGL_TENSOR_CORE_DECODE_ROWS=N (default 1: every size): bf16 decode batches of at least N rows run
    flashinfer's tensor-core (prefill-style) decode instead of its plain one; 0 keeps the plain kernel throughout
    (a model with 4 or more query heads per KV head takes tensor cores at every size, flashinfer's advice)."""
    return _count("MINISGL_TENSOR_CORE_DECODE_ROWS", 1, 1 << 30, "a number of rows (0: never)")
