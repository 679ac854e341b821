"""The CUDA wing's part of the engine's plan (core/engine/plan.py): which of its paths run on this GPU and model.

Each is decided once, from the config, the ``MINISGL_DISABLE_*`` switches (core/env.py) and what the device and
its tools can do; the plan records the answers and nothing reads the device again.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from core import env
from core.config import EngineConfig
from core.errors import InvalidParamsError
from core.kernels.cuda.attention.flashinfer_paged import use_tensor_core_decode
from core.kernels.cuda.fp8_decode import shape_unsupported_reason as fp8_cuda_shape_unsupported
from core.kernels.cuda.fp8_decode import unavailable_reason as fp8_cuda_unavailable

DEFAULT_GRAPH_MAX_BS = 256


class AttentionShape(NamedTuple):
    """One rank's attention heads, which some kernels take only some of (the engine reads them from the model's
    config before planning; a plan made without them assumes every kernel takes them)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int


def fp8_cuda_decode_runs(device: torch.device, attention: str, kv_fp8: bool, dtype: torch.dtype,
                         heads: AttentionShape | None = None) -> bool:
    """The CUDA fp8 decode for an fp8 pool under flashinfer attention, where the kernel takes the model's heads,
    the GPU has fp8 conversions and nvcc builds the kernel (once, to know); MINISGL_DISABLE_CUDA_FP8_DECODE=1 keeps
    the Triton paged kernel."""
    if not kv_fp8 or attention != "flashinfer" or env.disabled("CUDA_FP8_DECODE"):
        return False
    if heads is not None and fp8_cuda_shape_unsupported(*heads, dtype):
        return False
    return not fp8_cuda_unavailable(device)



def tensor_core_decode_rows(attention: str, kv_fp8: bool, heads: AttentionShape | None = None) -> int:
    """The decode batch size from which flashinfer's tensor-core decode runs on a bf16 pool: every size (1) for a
    model of 4+ query heads per KV head (flashinfer's advice, ``use_tensor_core_decode``), else
    MINISGL_TENSOR_CORE_DECODE_ROWS (default 1; 0: the plain kernel throughout); 0 for other backends."""
    if attention != "flashinfer" or kv_fp8:
        return 0
    asked = env.tensor_core_decode_rows()
    return 1 if heads is not None and use_tensor_core_decode(heads.num_heads, heads.num_kv_heads) else asked



def dependent_launch_runs_on(device: torch.device) -> bool:
    """Programmatic dependent launch needs compute capability 9.0 (Hopper) or later; Triton's interpreter has
    no use for it."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)



def graph_max_bs(config: EngineConfig, device: torch.device, attention: str) -> int:
    """Decode graphs on CUDA with flashinfer attention (the backend with fixed-buffer metadata); the cap defaults
    to the running-request cap (at most DEFAULT_GRAPH_MAX_BS) and 0 turns them off."""
    asked = config.cuda_graph_max_bs
    usable = device.type == "cuda" and attention == "flashinfer"
    if asked == 0 or (asked is None and not usable):
        return 0
    if not usable:
        raise InvalidParamsError("CUDA graphs need a CUDA device and the flashinfer attention backend; "
                                 "pass --cuda-graph-max-bs 0 to run without them")
    return min(asked or DEFAULT_GRAPH_MAX_BS, config.max_running_req)



def prefill_graph_runs(config: EngineConfig, attention: str, graph_bs: int, kv_fp8: bool) -> bool:
    """Prefill chunks under CUDA graphs where decode runs under graphs with flashinfer attention on a bf16
    pool (an fp8 pool's prefill reads its sequences back through a ragged plan, not taken under graphs) and one
    rank (not yet measured under tensor parallelism); MINISGL_DISABLE_PREFILL_GRAPH=1 keeps every chunk eager."""
    return (graph_bs > 0 and attention == "flashinfer" and not kv_fp8 and config.tp == 1
            and not env.disabled("PREFILL_GRAPH"))



def head_major_kv_runs(attention: str, kv_fp8: bool, c_decode: bool) -> bool:
    """A head-major pool under flashinfer attention, whose readers (flashinfer's wrappers, the fused QKV write, the
    small decode, the pool's own store and gather) all take it; not for an fp8 pool or beside the CPU's C decode
    step, whose kernels read token-major rows. MINISGL_DISABLE_HEAD_MAJOR_KV=1 keeps it token-major."""
    return attention == "flashinfer" and not kv_fp8 and not c_decode and not env.disabled("HEAD_MAJOR_KV")
