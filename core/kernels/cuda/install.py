"""The CUDA wing installed on an engine in one call, from what the plan chose.

Some of the wing is taken by the plan's other records, not installed: the kernels table runs the GEMVs and the
split-K linears from ``KernelChoices`` (core/kernels/dispatch.py), the attention backends their decode kernels;
the sampler is handed the race's kernels (``sampling_kernels``). What is installed here: a screen on the model's
LM head, the attention backend where the plan chose one of this wing's (attention/), and the CUDA graphs captured
over it (graphs/), which are the engine's fast step. With every switch off this does nothing: the engine keeps its torch backend and the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import nn

from core.attention.base import AttentionBackend
from core.config import EngineConfig
from core.kernels.choices import KernelChoices
from core.kernels.cuda.attention.flashinfer_fp8 import FlashInferFp8Backend
from core.kernels.cuda.attention.flashinfer_paged import FlashInferPagedBackend
from core.kernels.cuda.attention.paged_torch import PagedTorchBackend
from core.kernels.cuda.graphs.decode import CudaGraphRunner, Pick
from core.kernels.cuda.graphs.prefill import PrefillGraphRunner, prefill_shape
from core.kernels.cuda.graphs.step import CudaGraphs
from core.kernels.cuda.race import TRITON_SAMPLING
from core.kernels.cuda.screened_head import GpuScreenedHead
from core.kernels.sampling import SamplingKernels
from core.kvcache.pool import KVPool

Log = Callable[[str], None]


class CudaPlan(Protocol):
    """What this wing reads of the engine's plan (core/engine/plan.py's ``EnginePlan``, which is one)."""

    attention: str
    kv_fp8: bool
    fp8_paged_decode: bool
    fp8_cuda_decode: bool
    kernels: KernelChoices
    tensor_core_decode_rows: int
    whole_request_decode: bool
    cuda_graph_max_bs: int
    prefill_graph: bool


@dataclass(frozen=True)
class EngineParts:
    """The engine's parts the wing's backend and graphs work on: its KV pool and page table, one rank's attention
    heads (query heads, KV heads, head dim), the longest sequence, and the dummy page padding rows write into."""

    pool: KVPool
    page_table: torch.Tensor
    heads: tuple[int, int, int]
    max_seq_len: int
    dummy_page: int


@dataclass
class CudaFastPaths:
    """What ``install_cuda_fast_paths`` put in place: whether the LM head screens greedy rows, this wing's attention
    backend and its graphs (None where the plan chose none: the engine's torch backend, the model)."""

    screened_head: bool = False
    backend: AttentionBackend | None = None
    graphs: CudaGraphs | None = None


def install_cuda_fast_paths(model: nn.Module, plan: CudaPlan, config: EngineConfig, parts: EngineParts,
                            one_rank: bool, greedy_pick: Pick, log: Log | None = None) -> CudaFastPaths:
    """Put the plan's CUDA choices in place for ``model`` (the decoder, core/models/decoder.py), in this order: the
    LM head's screen (where ``one_rank``, no tensor parallelism: the screen needs the whole head), the attention
    backend, then the graphs, captured over both (a greedy batch-1 graph picks its tokens with ``greedy_pick``,
    the sampler's, where the head screens). ``config``: the request and chunk caps the graphs are sized for."""
    screened = screen_head(model, plan.kernels, one_rank)
    backend = attention_backend(plan, parts)
    graphs = (capture_graphs(model, backend, plan, config, parts, screened, greedy_pick, log)
              if backend is not None else None)
    return CudaFastPaths(screened, backend, graphs)


def sampling_kernels(kernels: KernelChoices) -> SamplingKernels | None:
    """The race and greedy pick this wing hands the sampler where the plan chose its Triton kernels, else None."""
    return TRITON_SAMPLING if kernels.triton_sampler else None


def screen_head(model: nn.Module, kernels: KernelChoices, one_rank: bool) -> bool:
    """A greedy request's LM head screened through an int8 copy of its weight (screened_head.py), where the Triton
    GEMVs run and the head has no screen yet (the CPU wing's). Returns whether this wing put one there."""
    head = model.lm_head
    if not (kernels.gpu_screened_head and one_rank) or head.screen is not None:
        return False
    head.screen = GpuScreenedHead.of(head.weight)
    return True


def attention_backend(plan: CudaPlan, parts: EngineParts) -> AttentionBackend | None:
    """The plan's attention backend where it is one of this wing's: flashinfer's for an fp8 or a bf16 pool, or the
    torch backend whose decode reads fp8 pages through the Triton paged kernel; else None."""
    args = (parts.pool, parts.page_table, *parts.heads)
    kernels = plan.kernels
    if plan.attention == "flashinfer" and plan.kv_fp8:
        return FlashInferFp8Backend(*args, cuda_decode=plan.fp8_cuda_decode, fast_gather=kernels.fp8_gather)
    if plan.attention == "flashinfer":
        return FlashInferPagedBackend(*args, small_decode=kernels.small_decode,
                                      pdl=kernels.pdl and kernels.small_decode,
                                      tensor_core_rows=plan.tensor_core_decode_rows,
                                      whole_request_decode=plan.whole_request_decode)
    if plan.fp8_paged_decode:
        return PagedTorchBackend(*args)
    return None


def capture_graphs(model: nn.Module, backend: AttentionBackend, plan: CudaPlan, config: EngineConfig,
                   parts: EngineParts, screened: bool, greedy_pick: Pick, log: Log | None) -> CudaGraphs | None:
    """Decode graphs up to the plan's batch size (none when it is 0), then the prefill graphs where the plan
    takes them, up to the largest chunk that can happen (``prefill_shape``)."""
    device = parts.page_table.device
    dummy_slot = parts.dummy_page * parts.pool.page_size
    decode = None
    if plan.cuda_graph_max_bs:
        assert backend.supports_cuda_graph, "the plan allows graphs only with a backend that has them"
        # a greedy request's step gets a graph of its own where the LM head screens it (one row)
        decode = CudaGraphRunner(model, backend, plan.cuda_graph_max_bs, dummy_slot, parts.dummy_page, device, log,
                                 (1,) if screened else (), greedy_pick)
    prefill = None
    if plan.prefill_graph:
        tokens, max_reqs = prefill_shape(config, parts.max_seq_len)
        prefill = PrefillGraphRunner(model, backend, tokens, max_reqs, dummy_slot, parts.dummy_page, device, log)
    return CudaGraphs(decode, prefill) if decode is not None or prefill is not None else None
