"""Engine options, validated once at construction so a bad value fails before any model is loaded."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.choices import ATTENTION_BACKENDS, CACHE_TYPES, KV_DTYPES, PRECISIONS, check_dtype_name
from core.errors import InvalidParamsError

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    return _DTYPES[check_dtype_name(value)]


@dataclass(frozen=True)
class EngineConfig:
    """What the engine is built with. ``None`` means "choose for this machine" (resolved by the Engine)."""

    model: str | None = None
    cache: str = "radix"  # "naive" recomputes every prompt; "radix" reuses shared prefixes
    page_size: int = 1
    max_running_req: int = 32
    num_pages: int | None = None  # explicit KV pool size; else sized from kv_cache_gb
    kv_cache_gb: float | None = None
    max_seq_len: int | None = None  # cap on prompt + output; default the model's context
    max_extend_tokens: int = 8192  # prefill token budget per step
    dtype: str | torch.dtype | None = None
    device: str | None = None
    attention: str | None = None
    cuda_graph_max_bs: int | None = None
    max_prefill_streak: int = 8  # decode gets a step after this many consecutive prefills while requests decode
    tp: int = 1
    # overlap scheduling: prepare step N+1 while step N runs. None: on for CUDA, off on CPU (where it gains
    # nothing but runs the same bookkeeping); MINISGL_DISABLE_OVERLAP_SCHEDULING=1 turns it off regardless
    # (decided with every other switch in core/engine/plan.py)
    overlap: bool | None = None
    # the KV cache's storage: 'auto' keeps the model's dtype, 'fp8' stores e4m3 with per-head scales
    # (core/kvcache/pool.py), attention then computing in float32 (the torch backend)
    kv_dtype: str = "auto"
    # 'exact' (the default) keeps the model's dtype (on a CPU in float32 a single request's decode steps run in C
    # where it has AVX2 and FMA); 'fast' lets the plan pick int8 weights for the C step and, with AMX, bf16 copies
    # of the linears for prefill and batches, or say why it keeps float32 as it is; 'int8' asks for int8 weights
    # (core/choices.py, core/engine/plan.py)
    precision: str = "exact"

    def __post_init__(self) -> None:
        def positive_int(name: str, value: object, allow_none: bool = False) -> None:
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParamsError(f"{name} must be an integer >= 1, got {value!r}")

        if self.cache not in CACHE_TYPES:
            raise InvalidParamsError(f"unknown cache {self.cache!r}; use one of {', '.join(CACHE_TYPES)}")
        if self.attention is not None and self.attention not in ATTENTION_BACKENDS:
            raise InvalidParamsError(
                f"unknown attention backend {self.attention!r}; use one of {', '.join(ATTENTION_BACKENDS)}")
        positive_int("page_size", self.page_size)
        positive_int("max_running_req", self.max_running_req)
        positive_int("num_pages", self.num_pages, allow_none=True)
        positive_int("max_seq_len", self.max_seq_len, allow_none=True)
        positive_int("max_extend_tokens", self.max_extend_tokens)
        positive_int("max_prefill_streak", self.max_prefill_streak)
        positive_int("tp", self.tp)
        if self.num_pages is not None and self.num_pages < self.max_running_req:
            raise InvalidParamsError(f"num_pages={self.num_pages} is too small: the pool needs at least one page "
                                     f"per request row (max_running_req={self.max_running_req})")
        if self.kv_cache_gb is not None and not self.kv_cache_gb > 0:
            raise InvalidParamsError(f"kv_cache_gb must be > 0, got {self.kv_cache_gb!r}")
        if self.cuda_graph_max_bs is not None and (isinstance(self.cuda_graph_max_bs, bool)
                                                   or not isinstance(self.cuda_graph_max_bs, int)
                                                   or self.cuda_graph_max_bs < 0):
            raise InvalidParamsError(f"cuda_graph_max_bs must be an integer >= 0, got {self.cuda_graph_max_bs!r}")
        if self.overlap is not None and not isinstance(self.overlap, bool):
            raise InvalidParamsError(f"overlap must be True, False or None, got {self.overlap!r}")
        parse_dtype(self.dtype)
        if self.kv_dtype not in KV_DTYPES:
            raise InvalidParamsError(f"unknown kv_dtype {self.kv_dtype!r}; use one of {', '.join(KV_DTYPES)}")
        if self.precision not in PRECISIONS:
            raise InvalidParamsError(f"unknown precision {self.precision!r}; use one of {', '.join(PRECISIONS)}")
        if self.device is not None:
            try:
                torch.device(self.device)
            except RuntimeError:
                raise InvalidParamsError(f"unknown device {self.device!r}") from None
