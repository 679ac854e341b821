"""The Engine: the model and everything a forward pass touches on the device.

It owns the weights, the KV pool, the page table, the attention backend and the sampler. The scheduler
decides what to run; the engine runs one prepared batch and hands back the sampled tokens, both on the
device (fed back into the token pool) and on their way to the host (for the scheduler's bookkeeping).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from core.attention.base import AttentionBackend
from core.config import EngineConfig, parse_dtype
from core.engine.context import forward_context
from core.engine.sampler import SampleArgs, Sampler
from core.errors import InvalidParamsError
from core.kvcache.pool import KVPool
from core.distributed.comm import broadcast_from_primary, min_over_ranks
from core.distributed.info import get_tp_info
from core.layers.linear import local_kv_heads
from core.models.config import ModelConfig
from core.models.loader import load_model, read_model_config
from core.request import Batch

DEFAULT_CPU_KV_GB = 1.0


@dataclass
class ForwardOutput:
    next_tokens: torch.Tensor  # on the device
    next_tokens_host: torch.Tensor  # host copy, valid once copy_done has completed
    copy_done: torch.cuda.Event | None

    def wait(self) -> torch.Tensor:
        if self.copy_done is not None:
            self.copy_done.synchronize()
        return self.next_tokens_host


def pick_device(requested: str | None) -> torch.device:
    if requested is not None:
        device = torch.device(requested)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise InvalidParamsError("device 'cuda' was requested but CUDA is not available on this machine")
        return device
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class Engine:
    def __init__(self, config: EngineConfig, model_dir: Path, log: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.device = pick_device(config.device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = parse_dtype(config.dtype) or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.tp = get_tp_info()  # fixed for this engine's life; the layers were sliced for it
        self.model_config: ModelConfig = read_model_config(model_dir)
        cfg = self.model_config
        self.max_seq_len = min(config.max_seq_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.model = load_model(model_dir, cfg, self.device, self.dtype, self.max_seq_len)
        self.page_size = config.page_size
        self.num_kv_heads = local_kv_heads(cfg.num_kv_heads)[0]
        self.num_pages = self._pool_pages()
        self.kv_pool = KVPool(cfg.num_layers, self.num_pages, self.page_size, self.num_kv_heads, cfg.head_dim,
                              self.dtype, self.device)
        # one row per running request; a position's KV slot. Rows beyond max_running_req are scratch for padding.
        self.page_table = torch.zeros(config.max_running_req + 1, self.max_seq_len, dtype=torch.int64,
                                      device=self.device)
        self.attn_backend = self._make_backend()
        self.sampler = Sampler(self.device)
        if log:
            log(f"engine ready: {self.device} {str(self.dtype).removeprefix('torch.')}, "
                f"{self.num_pages} KV pages of {self.page_size}, backend {type(self.attn_backend).__name__}")

    def _pool_pages(self) -> int:
        cfg, config = self.model_config, self.config
        if config.num_pages is not None:
            return config.num_pages
        per_token = KVPool.bytes_per_token(cfg.num_layers, self.num_kv_heads, cfg.head_dim, self.dtype)
        budget_gb = config.kv_cache_gb or self._default_kv_gb()
        pages = int(budget_gb * (1 << 30)) // (per_token * self.page_size)
        # no need for more than every row filled to the longest sequence
        needed = config.max_running_req * (-(-self.max_seq_len // self.page_size))
        pages = min_over_ranks(min(pages, needed), self.tp.size, self.device)  # free memory differs per GPU
        if pages < config.max_running_req:
            raise InvalidParamsError(f"a KV budget of {budget_gb} GiB gives only {pages} pages; it needs at least "
                                     f"{config.max_running_req} (one per request row)")
        return pages

    def _default_kv_gb(self) -> float:
        if self.device.type != "cuda":
            return DEFAULT_CPU_KV_GB
        free, _ = torch.cuda.mem_get_info(self.device)
        return 0.85 * free / (1 << 30)

    def _make_backend(self) -> AttentionBackend:
        cfg = self.model_config
        name = self.config.attention or "torch"
        args = (self.kv_pool, self.page_table, cfg.num_heads // self.tp.size, self.num_kv_heads, cfg.head_dim)
        if name == "flashinfer":
            raise InvalidParamsError("the flashinfer attention backend is not available yet; use --attention torch")
        from core.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend(*args)

    def forward_batch(self, batch: Batch, sample_args: SampleArgs, logits_indices: torch.Tensor) -> ForwardOutput:
        with forward_context(batch, self.attn_backend), torch.inference_mode():
            logits = self.model(batch.input_ids, batch.positions, logits_indices)
            # ranks sample identically from identical gathered logits; the broadcast makes agreement certain
            next_tokens = broadcast_from_primary(self.sampler.sample(logits, sample_args), self.tp.size)
        if self.device.type == "cuda":
            host = torch.empty(next_tokens.shape, dtype=next_tokens.dtype, pin_memory=True)
            host.copy_(next_tokens, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            return ForwardOutput(next_tokens, host, event)
        return ForwardOutput(next_tokens, next_tokens, None)
