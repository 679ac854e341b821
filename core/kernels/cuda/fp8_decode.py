"""The fp8 paged decode in CUDA (core/kernels/cuda/fp8_decode.cu): built with nvcc at first use, called by ctypes.

Why it exists beside the Triton paged kernel (core/kernels/cuda/paged_decode.py), which reads the same pages: on
fp8 pages the Triton kernel is bound by moving each tile from its load layout into the tensor cores' operand
layout, not by the bytes (docs/BENCHMARKS.md), so fp8 ran no faster than bf16.
The CUDA kernel loads every byte straight into the operand registers (fp8_decode.cu says how), so its time
should follow the bytes, half of bf16's.

It needs nvcc (the CUDA toolkit) where the engine runs and fp8 conversions in hardware (compute capability
8.9 and up); ``unavailable_reason`` says why not, and the plan then keeps the Triton kernel. The shared object
is cached like the CPU's C kernels (core/kernels/c_build.py), one per GPU architecture. Launches go to torch's
current stream, so CUDA graphs capture them like any kernel.
"""

from __future__ import annotations

import ctypes
import functools
import shutil
from pathlib import Path

import torch

from core.kernels.c_build import BuildResult, build_library
from core.kvcache.pool import KVPool

SOURCE = Path(__file__).with_name("fp8_decode.cu")
MAX_GROUP = 8  # query heads per KV head: the products' narrow side
HEAD_DIMS = (64, 128)
NVCC_PATHS = ("/usr/local/cuda/bin/nvcc",)

_P = ctypes.c_void_p
SIGNATURES = {"minisgl_fp8_decode": ([_P] * 11 + [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_int, _P],
                                     ctypes.c_int)}


def find_nvcc() -> str | None:
    return shutil.which("nvcc") or next((p for p in NVCC_PATHS if Path(p).exists()), None)


def shape_unsupported_reason(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> str:
    """Why the kernel cannot take this model's attention ('' when it can)."""
    if head_dim not in HEAD_DIMS:
        return f"the CUDA fp8 decode takes head dims {' and '.join(map(str, HEAD_DIMS))}, not {head_dim}"
    if num_heads % num_kv_heads or num_heads // num_kv_heads > MAX_GROUP:
        return f"the CUDA fp8 decode takes up to {MAX_GROUP} query heads per KV head"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"the CUDA fp8 decode computes in bf16 or float16, not {str(dtype).removeprefix('torch.')}"
    return ""


def device_unsupported_reason(device: torch.device) -> str:
    """Why this device cannot run the kernel ('' when it can): a CUDA GPU of compute capability 8.9 or later."""
    if device.type != "cuda":
        return "the CUDA fp8 decode needs a CUDA device"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"the CUDA fp8 decode needs compute capability 8.9 or later (fp8 conversions), not {major}.{minor}"
    return ""


@functools.cache
def load_library(arch: str, defines: tuple[str, ...] = ()) -> BuildResult:
    """The kernel built for ``arch`` (e.g. '90'), once per process; the result says why not if it cannot be.
    ``defines`` ('NAME=VALUE') turn the kernel's choices off for the microbench's A/B (fp8_decode.cu names them);
    the engine builds the defaults."""
    nvcc = find_nvcc()
    if nvcc is None:
        return BuildResult(None, "no nvcc found for the CUDA fp8 decode (the CUDA toolkit's compiler)")
    flags = ("-O3", "-std=c++17", f"-arch=sm_{arch}", *(f"-D{d}" for d in defines))
    return build_library(SOURCE, flags, signatures=SIGNATURES, compiler=nvcc, pic=("-Xcompiler", "-fPIC"))


@functools.cache
def library_for(device: torch.device) -> BuildResult:
    """The kernel built for ``device``'s architecture, or why there is none; asked once per device, so a decode
    call costs no capability query."""
    reason = device_unsupported_reason(device)
    if reason:
        return BuildResult(None, reason)
    major, minor = torch.cuda.get_device_capability(device)
    return load_library(f"{major}{minor}")


def unavailable_reason(device: torch.device) -> str:
    """Why the engine on ``device`` cannot decode fp8 pages with this kernel ('' when it can); builds it (once) to
    know."""
    return library_for(device).reason


def fp8_decode_cuda(q: torch.Tensor, pool: KVPool, layer: int, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                    kv_last: torch.Tensor, scale: float, out: torch.Tensor | None = None, splits: int = 1,
                    part_o: torch.Tensor | None = None, part_lse: torch.Tensor | None = None,
                    library: ctypes.CDLL | None = None) -> torch.Tensor:
    """What ``paged_decode`` computes on an fp8 pool: q [batch, heads, head_dim] bf16 or float16, the pages of
    request i ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`` with ``kv_last[i]`` tokens in the last; returns
    [batch, heads, head_dim] in q's dtype. ``splits`` blocks per (request, KV head) each write a partial into
    ``part_o`` ([>= batch * heads * splits, head_dim] float32) and ``part_lse`` (made here when not given: not
    under a graph), merged by a second kernel. ``library``: a build of other choices (``load_library``'s
    defines) instead of the device's default one."""
    assert pool.fp8, "the CUDA decode reads fp8 pages"
    batch, num_heads, head_dim = q.shape
    k_cache, v_cache = pool.k_layers[layer], pool.v_layers[layer]
    num_kv_heads = k_cache.shape[1]
    reason = shape_unsupported_reason(num_heads, num_kv_heads, head_dim, q.dtype)
    assert not reason, reason
    library = library or library_for(q.device).library
    assert library is not None, "the plan chose the CUDA fp8 decode where it did not build"
    q = q.contiguous()
    out = torch.empty_like(q) if out is None else out
    if splits > 1 and (part_o is None or part_lse is None):
        part_o = torch.empty(batch * num_heads * splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(batch * num_heads * splits, dtype=torch.float32, device=q.device)
    for index in (kv_indptr, kv_indices, kv_last):
        assert index.dtype == torch.int32 and index.is_contiguous()
    status = library.minisgl_fp8_decode(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), pool.k_scale[layer].data_ptr(),
        pool.v_scale[layer].data_ptr(), kv_indptr.data_ptr(), kv_indices.data_ptr(), kv_last.data_ptr(),
        out.data_ptr(), part_o.data_ptr() if splits > 1 else None, part_lse.data_ptr() if splits > 1 else None,
        batch, num_heads, num_kv_heads, head_dim, pool.page_size, splits, scale, int(q.dtype == torch.bfloat16),
        torch.cuda.current_stream(q.device).cuda_stream)
    if status != 0:
        raise RuntimeError(f"the CUDA fp8 decode failed to launch (cudaError {status})")
    return out
