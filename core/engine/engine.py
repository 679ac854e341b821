"""The Engine: the model and everything a forward pass touches on the device.

It owns the weights, the KV pool, the page table, the attention backend and the sampler. The scheduler
decides what to run; the engine runs one prepared batch and hands back the sampled tokens, both on the
device (fed back into the token pool) and on their way to the host (for the scheduler's bookkeeping).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from core.words import plural
from core.arith import pages_for
from core.attention.base import AttentionBackend
from core.config import EngineConfig, parse_dtype
from core.attention.context import forward_context
from core.engine.describe import kernel_words, size_words, weight_words
from core.kernels.cuda.graphs.decode import CudaGraphRunner
from core.engine.kv_budget import default_kv_gb, pool_pages
from core.kernels.cuda.graphs.prefill import PrefillGraphRunner
from core.engine.plan import AttentionShape, EnginePlan, plan_engine
from core.engine.sampler import SampleArgs, Sampler, TokenLogprobs, token_logprobs
from core.errors import InvalidParamsError
from core.kvcache.pool import KVPool
from core.distributed.comm import broadcast_from_primary
from core.kernels.cpu.install import install_cpu_fast_paths
from core.kernels.cuda.install import install_cuda_fast_paths
from core.kernels.dispatch import install_kernels, kernels_for
from core.kernels.derived import DerivedCache, source_key
from core.distributed.info import get_tp_info
from core.layers.linear import local_kv_heads
from core.model_config import ModelConfig
from core.models.loader import load_model, read_model_config
from core.models.random_spec import RandomSpec
from core.models.weights import derived_cache_path
from core.request import Batch

@dataclass
class ForwardOutput:
    next_tokens: torch.Tensor  # on the device
    next_tokens_host: torch.Tensor  # host copy, valid once copy_done has completed
    copy_done: torch.cuda.Event | None  # recorded after everything the step queued on the device
    logprobs: TokenLogprobs | None = None  # host copy, when some request of the batch asked for them

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
    def __init__(self, config: EngineConfig, model_dir: Path | RandomSpec,
                 log: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.device = pick_device(config.device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = parse_dtype(config.dtype) or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.tp_info = get_tp_info()  # fixed for this engine's life; the layers were sliced for it
        self.model_config: ModelConfig = read_model_config(model_dir)
        cfg = self.model_config
        # every switch, decided here once (fails before the model loads when an ask cannot be met)
        heads = AttentionShape(cfg.num_heads // self.tp_info.size, local_kv_heads(cfg.num_kv_heads)[0], cfg.head_dim)
        self.plan: EnginePlan = plan_engine(config, self.device, self.dtype, heads)
        self.dtype = self.plan.precision.dtype
        self.max_seq_len = min(config.max_seq_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        # what is derived from the weights (fused weights, codes, int8 copies, magnitudes), read back from the last
        # start's file where it has them (core/kernels/derived.py)
        derived = DerivedCache(derived_cache_path(model_dir, f"{str(self.dtype).removeprefix('torch.')}-rank"
                                                  f"{self.tp_info.rank}of{self.tp_info.size}", source_key())
                               if isinstance(model_dir, Path) else None)
        self.model = load_model(model_dir, cfg, self.device, self.dtype, self.max_seq_len, derived)
        self.page_size = config.page_size
        self.num_kv_heads = local_kv_heads(cfg.num_kv_heads)[0]
        self.kv_fp8 = self.plan.kv_fp8
        # what one cached token costs this rank's pool: what the benchmark's floor reads per token of context
        self.kv_bytes_per_token = KVPool.bytes_per_token(cfg.num_layers, self.num_kv_heads, cfg.head_dim,
                                                         self.dtype, self.kv_fp8)
        self.num_pages = pool_pages(config, self.kv_bytes_per_token, self.page_size, self.max_seq_len,
                                    self.tp_info.size, self.device)
        # one page more than the cache hands out: padding rows of a CUDA-graph batch write their KV there
        self.dummy_page = self.num_pages
        self.kv_pool = KVPool(cfg.num_layers, self.num_pages + 1, self.page_size, self.num_kv_heads, cfg.head_dim,
                              self.dtype, self.device, fp8=self.kv_fp8, head_major=self.plan.head_major_kv)
        # one row per running request; a position's KV slot. The spare last row (padding) points at the dummy page.
        # Whole pages wide, so a page's slots are always written together.
        width = pages_for(self.max_seq_len, self.page_size) * self.page_size
        self.page_table = torch.zeros(config.max_running_req + 1, width, dtype=torch.int64, device=self.device)
        self.pad_row = config.max_running_req
        self.page_table[self.pad_row] = self.dummy_page * self.page_size
        # the fast paths the plan chose, each wing's in one call (with none, the torch layers as they are)
        install_kernels(self.model, kernels_for(self.plan.kernels))
        one_rank = self.tp_info.size == 1
        self.cpu_paths = install_cpu_fast_paths(self.model, cfg, self.plan.kernels, self.plan.precision,
                                                self.plan.c_attention, self.kv_pool, width, one_rank, derived)
        self.cpu_decode = self.cpu_paths.decode_step  # a single request's decode step as one C call, or None
        self.screened_head = (self.cpu_paths.screened_head or
                              install_cuda_fast_paths(self.model, self.plan.kernels, one_rank))
        self.attn_backend = self._make_backend()
        derived.save()
        self.sampler = Sampler(self.device, triton_race=self.plan.kernels.triton_sampler)
        if self.device.type == "cuda":
            self.sampler.warm_up(cfg.vocab_size, self.dtype)
        self.graph_runner = self._make_graph_runner(log)
        self.prefill_graph = self._make_prefill_graph(log)
        # forward passes run on their own stream, so the scheduler's stream can prepare the next step meanwhile
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if log:
            log(self.summary())
            if self.precision_note:
                log(self.precision_note)

    @property
    def precision_note(self) -> str:
        """For a precision other than 'exact': one line saying what it picked on this machine and why (which
        instructions the CPU lacks, when it kept float32)."""
        return self.plan.precision.note

    def summary(self) -> str:
        """The one line a user needs when the engine is ready: where it runs, in which dtype, and how many tokens
        the KV cache holds (``describe`` has the plan's details)."""
        tokens = self.num_pages * self.page_size
        size = size_words(tokens * self.kv_bytes_per_token) + (", fp8" if self.plan.kv_fp8 else "")
        return (f"engine ready on {self.device}, {str(self.dtype).removeprefix('torch.')}: room for "
                f"{plural(tokens, 'token')} in the KV cache ({size})")

    def describe(self) -> str:
        """The engine in detail, for ``--verbose`` and ``minisgl bench``: where it runs, how much the KV cache
        holds and why, and what its plan chose (attention, kernels, weight formats, graphs)."""
        tokens = self.num_pages * self.page_size
        per_token = self.kv_bytes_per_token
        rows = self.config.max_running_req
        if self.config.num_pages is not None:
            why = f"{plural(self.num_pages, 'page')} as asked"
        elif self.num_pages * self.page_size >= rows * self.max_seq_len:
            running = "the one running request" if rows == 1 else f"all {rows} running requests"
            why = (f"room for {running} at the full {self.max_seq_len:,}-token context, so it "
                   f"grows with the number of requests run at once")
        else:
            why = f"the {self.config.kv_cache_gb or default_kv_gb(self.device):.1f} GiB budget for the cache"
        plan = self.plan
        graphs = f"CUDA graphs up to batch {plan.cuda_graph_max_bs}" if plan.cuda_graph_max_bs else "no CUDA graphs"
        if self.prefill_graph is not None:
            graphs += f" and for full prefill chunks of {plural(self.prefill_graph.tokens, 'token')}"
        packed = weight_words(plan, self.cpu_paths.four_bit_panels, self.screened_head)
        layout = f" in head-major pages of {self.page_size}" if plan.head_major_kv and self.page_size > 1 else ""
        size = size_words(tokens * per_token)
        return (f"engine on {self.device} in {str(self.dtype).removeprefix('torch.')}: KV cache for "
                f"{plural(tokens, 'token')}{' in fp8' if plan.kv_fp8 else ''}{layout} ({size}; {why}), "
                f"{plan.attention} attention with {kernel_words(plan)}{packed}, {graphs}")

    def _make_backend(self) -> AttentionBackend:
        cfg = self.model_config
        args = (self.kv_pool, self.page_table, cfg.num_heads // self.tp_info.size, self.num_kv_heads, cfg.head_dim)
        kernels = self.plan.kernels
        if self.plan.attention == "flashinfer" and self.plan.kv_fp8:
            from core.kernels.cuda.attention.flashinfer_fp8 import FlashInferFp8Backend

            return FlashInferFp8Backend(*args, cuda_decode=self.plan.fp8_cuda_decode, fast_gather=kernels.fp8_gather)
        if self.plan.attention == "flashinfer":
            from core.kernels.cuda.attention.flashinfer_paged import FlashInferPagedBackend

            return FlashInferPagedBackend(*args, small_decode=kernels.small_decode,
                                          pdl=kernels.pdl and kernels.small_decode,
                                          tensor_core_rows=self.plan.tensor_core_decode_rows,
                                          whole_request_decode=self.plan.whole_request_decode)
        if self.plan.fp8_paged_decode:
            from core.kernels.cuda.attention.paged_torch import PagedTorchBackend  # decode reads fp8 pages in place

            return PagedTorchBackend(*args)
        from core.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend(*args, c_attention=self.cpu_paths.attention)

    def _make_graph_runner(self, log: Callable[[str], None] | None) -> CudaGraphRunner | None:
        """Decode graphs up to the plan's batch size (none when it is 0)."""
        if not self.plan.cuda_graph_max_bs:
            return None
        assert self.attn_backend.supports_cuda_graph, "the plan allows graphs only with a backend that has them"
        # a greedy request's step gets a graph of its own where the LM head screens it (one row)
        greedy_sizes = (1,) if self.screened_head else ()
        return CudaGraphRunner(self.model, self.attn_backend, self.plan.cuda_graph_max_bs,
                               self.dummy_page * self.page_size, self.dummy_page, self.device, log, greedy_sizes,
                               self.sampler.greedy)

    def _make_prefill_graph(self, log: Callable[[str], None] | None) -> PrefillGraphRunner | None:
        """The full prefill chunk's graph, where the plan takes it and a full chunk can happen at all (enough
        rows of long enough sequences to fill one)."""
        config = self.config
        tokens = config.max_extend_tokens
        if not self.plan.prefill_graph or tokens > config.max_running_req * self.max_seq_len:
            return None
        return PrefillGraphRunner(self.model, self.attn_backend, tokens, min(config.max_running_req, tokens),
                                  self.dummy_page * self.page_size, self.dummy_page, self.device, log)

    def release_cuda_graphs(self) -> None:
        """Drop the captured graphs (every step runs eagerly from here on). Under tensor parallelism they hold
        NCCL work, and must be gone before the communicators are torn down."""
        if self.graph_runner is None and self.prefill_graph is None:
            return
        self.graph_runner = self.prefill_graph = None
        torch.cuda.synchronize(self.device)
        gc.collect()

    def padded_size(self, batch: Batch) -> int:
        """Rows the batch will run with: a decode batch under CUDA graphs is padded to a captured size, a full
        prefill chunk to the prefill graph's request count."""
        if batch.is_prefill:
            graph = self.prefill_graph
            return graph.max_reqs if graph is not None and graph.fits(batch) else batch.size
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            return self.graph_runner.padded_size(batch.size)
        return batch.size

    def gather_inputs(self, token_pool: torch.Tensor, places: torch.Tensor, batch: Batch) -> torch.Tensor:
        """A decode batch's input tokens from their places in the flat token pool: under a CUDA graph straight
        into its input buffer (one copy fewer a step)."""
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            return self.graph_runner.gather_inputs(token_pool, places)
        return token_pool[places]

    def forward_batch(self, batch: Batch, sample_args: SampleArgs,
                      logits_indices: torch.Tensor) -> tuple[torch.Tensor, TokenLogprobs | None]:
        """Run the model on a prepared batch and sample; the next tokens stay on the device. Logprobs come back
        too (still on the device) when some request of the batch asked for them."""
        # a greedy step that wants no log-probabilities needs only each row's largest logit exact
        greedy = sample_args.all_greedy and sample_args.logprobs < 0
        picked = None  # tokens a greedy graph picked itself: the sampler's greedy pick, captured
        with forward_context(batch, self.attn_backend, greedy_logits=greedy), torch.inference_mode():
            if self.graph_runner is not None and self.graph_runner.can_run(batch):
                logits, picked = self.graph_runner.run(batch)
            elif self.prefill_graph is not None and self.prefill_graph.can_run(batch):
                logits = self.prefill_graph.run(batch, logits_indices)
            elif self.cpu_decode is not None and batch.is_decode and batch.size == 1:
                req = batch.reqs[0]
                logits = self.cpu_decode(batch.input_ids, batch.positions,
                                         self.page_table[req.table_idx, :req.device_len], screen=greedy)
            else:
                self.attn_backend.begin_forward(batch)
                logits = self.model(batch.input_ids, batch.positions, logits_indices)
            # ranks sample identically from identical gathered logits; the broadcast makes agreement certain
            if picked is None:
                picked = self.sampler.sample(logits, sample_args)
            tokens = broadcast_from_primary(picked, self.tp_info.size)
            if sample_args.logprobs < 0:
                return tokens, None
            return tokens, token_logprobs(logits, tokens, sample_args.logprobs)

    def to_host(self, next_tokens: torch.Tensor, logprobs: TokenLogprobs | None = None) -> ForwardOutput:
        """Start copying the sampled tokens to pinned host memory; the event marks the end of the step's work."""
        if self.device.type != "cuda":
            return ForwardOutput(next_tokens, next_tokens, None, logprobs)
        host = torch.empty(next_tokens.shape, dtype=next_tokens.dtype, pin_memory=True)
        host.copy_(next_tokens, non_blocking=True)
        host_logprobs = logprobs.to("cpu", non_blocking=True) if logprobs is not None else None
        event = torch.cuda.Event()
        event.record()
        return ForwardOutput(next_tokens, host, event, host_logprobs)
