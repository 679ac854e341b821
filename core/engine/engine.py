"""The Engine: the model and everything a forward pass touches on the device.

It owns the weights, the KV pool, the page table, the attention backend and the sampler. The scheduler
decides what to run; the engine runs one prepared batch and hands back the sampled tokens, both on the
device (fed back into the token pool) and on their way to the host (for the scheduler's bookkeeping).

Its reference step is the torch attention backend and the model. Each wing of fast paths (core/kernels/cpu/,
core/kernels/cuda/) is installed by one call from the plan; a wing that runs some batches its own way end to end
(the CUDA graphs' replays, the CPU's C decode step) hands over a fast step, which the engine tries first
(core/engine/fast_step.py).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from core.words import ENGINE_READY, plural
from core.arith import pages_for
from core.attention.base import AttentionBackend
from core.attention.torch_backend import TorchAttentionBackend
from core.config import EngineConfig, parse_dtype
from core.attention.context import forward_context
from core.engine.describe import budget_words, kernel_words, size_words, weight_words
from core.engine.fast_step import FastStep, StepResult
from core.engine.kv_budget import device_memory_plan, pool_pages
from core.engine.plan import AttentionShape, EnginePlan, plan_engine
from core.engine.sampler import SampleArgs, Sampler, TokenLogprobs, token_logprobs
from core.errors import InvalidParamsError
from core.kvcache.pool import KVPool
from core.distributed.comm import broadcast_from_primary
from core.kernels.cpu.install import install_cpu_fast_paths
from core.kernels.cuda.footprint import CudaFootprint, cuda_footprint
from core.kernels.cuda.graphs.step import CudaGraphs
from core.kernels.cuda.install import EngineParts, install_cuda_fast_paths, sampling_kernels
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
        torch.set_num_threads(self.plan.threads)  # before the kernels are built: they take torch's count
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
        # the card's memory planned once: the weights are loaded, what the CUDA wing keeps after the pool is counted
        # (core/kernels/cuda/footprint.py), the pool gets the rest less a reserve (core/engine/kv_budget.py)
        self.footprint = (cuda_footprint(self.plan, config, cfg, self.dtype, self.max_seq_len, self.tp_info.size)
                          if self.device.type == "cuda" else CudaFootprint())
        self.memory = device_memory_plan(self.device, self.footprint.total)
        self.num_pages = pool_pages(config, self.kv_bytes_per_token, self.page_size, self.max_seq_len,
                                    self.tp_info.size, self.device, self.memory)
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
        self.sampler = Sampler(self.device, kernels=sampling_kernels(self.plan.kernels))
        if self.device.type == "cuda":
            self.sampler.warm_up(cfg.vocab_size, self.dtype)
        self._install_fast_paths(heads, derived, log)
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
        return (f"{ENGINE_READY} on {self.device}, {str(self.dtype).removeprefix('torch.')}: room for "
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
            why = budget_words(self.config, self.memory)
        plan = self.plan
        graphs = f"CUDA graphs up to batch {plan.cuda_graph_max_bs}" if plan.cuda_graph_max_bs else "no CUDA graphs"
        if self.graphs is not None and self.graphs.prefill is not None:
            graphs += f" and for prefill chunks of up to {plural(self.graphs.prefill.tokens, 'token')}"
        packed = weight_words(plan, self.cpu_paths.four_bit_panels, self.screened_head)
        layout = f" in head-major pages of {self.page_size}" if plan.head_major_kv and self.page_size > 1 else ""
        size = size_words(tokens * per_token)
        threads = f" on {plural(plan.threads, 'thread')}" if self.device.type == "cpu" else ""
        return (f"engine on {self.device}{threads} in {str(self.dtype).removeprefix('torch.')}: KV cache for "
                f"{plural(tokens, 'token')}{' in fp8' if plan.kv_fp8 else ''}{layout} ({size}; {why}), "
                f"{plan.attention} attention with {kernel_words(plan)}{packed}, {graphs}")

    def _install_fast_paths(self, heads: AttentionShape, derived: DerivedCache,
                            log: Callable[[str], None] | None) -> None:
        """The fast paths the plan chose, each wing's in one call (with none, the torch layers, the torch attention
        backend and the model as they are)."""
        install_kernels(self.model, kernels_for(self.plan.kernels))
        one_rank = self.tp_info.size == 1
        self.cpu_paths = install_cpu_fast_paths(self.model, self.model_config, self.plan.kernels, self.plan.precision,
                                                self.plan.c_attention, self.kv_pool, self.page_table, heads, one_rank,
                                                derived)
        derived.save()
        parts = EngineParts(self.kv_pool, self.page_table, heads, self.max_seq_len, self.dummy_page)
        cuda = install_cuda_fast_paths(self.model, self.plan, self.config, parts, one_rank, self.sampler.greedy, log)
        self.screened_head = self.cpu_paths.screened_head or cuda.screened_head
        # the reference backend, unless a wing installed one of its own (the CUDA wing's graphs were captured on it)
        wing_backend = cuda.backend if cuda.backend is not None else self.cpu_paths.backend
        self.attn_backend: AttentionBackend = (
            wing_backend if wing_backend is not None else TorchAttentionBackend(self.kv_pool, self.page_table, *heads))
        self.graphs: CudaGraphs | None = cuda.graphs  # captured decode steps and prefill chunks
        # the wings' own steps (graph replays, the CPU's C decode step), tried on every batch before the model
        self.fast_steps: tuple[FastStep, ...] = tuple(
            step for step in (self.graphs, self.cpu_paths.fast_step) if step is not None)

    def release_cuda_graphs(self) -> None:
        """Drop the captured graphs (every step runs eagerly from here on). Under tensor parallelism they hold
        NCCL work, and must be gone before the communicators are torn down."""
        if self.graphs is None:
            return
        cuda_graphs, self.graphs = self.graphs, None
        self.fast_steps = tuple(step for step in self.fast_steps if step is not cuda_graphs)
        torch.cuda.synchronize(self.device)
        gc.collect()

    def padded_size(self, batch: Batch) -> int:
        """Rows the batch will run with: a decode batch under CUDA graphs is padded to a captured size, a
        prefill chunk to the prefill graphs' request count."""
        return batch.size if self.graphs is None else self.graphs.padded_size(batch)

    def gather_inputs(self, token_pool: torch.Tensor, places: torch.Tensor, batch: Batch) -> torch.Tensor:
        """A decode batch's input tokens from their places in the flat token pool: under a CUDA graph straight
        into its input buffer (one copy fewer a step)."""
        return token_pool[places] if self.graphs is None else self.graphs.gather_inputs(token_pool, places, batch)

    def forward_batch(self, batch: Batch, sample_args: SampleArgs,
                      logits_indices: torch.Tensor) -> tuple[torch.Tensor, TokenLogprobs | None]:
        """Run the model on a prepared batch and sample; the next tokens stay on the device. Logprobs come back
        too (still on the device) when some request of the batch asked for them."""
        # a greedy step that wants no log-probabilities and controls no logits needs only each row's largest exact
        greedy = sample_args.only_largest_logit
        return self.sample(*self.forward(batch, logits_indices, greedy), sample_args)

    def forward(self, batch: Batch, logits_indices: torch.Tensor, greedy: bool) -> StepResult:
        """The model on a prepared batch: its logits, and the tokens where a fast step picked them itself (a
        greedy graph), else None. A batch under a grammar runs this alone, then ``sample`` once its token masks
        are filled (they follow the previous step's tokens: core/scheduler/grammar_step.py)."""
        with forward_context(batch, self.attn_backend, greedy_logits=greedy), torch.inference_mode():
            for step in self.fast_steps:
                if (ran := step.run(batch, logits_indices, greedy)) is not None:
                    return ran
            # no fast path takes the batch: the reference step
            self.attn_backend.begin_forward(batch)
            return self.model(batch.input_ids, batch.positions, logits_indices), None

    def sample(self, logits: torch.Tensor, picked: torch.Tensor | None,
               sample_args: SampleArgs) -> tuple[torch.Tensor, TokenLogprobs | None]:
        """Each row's next token (``picked`` where the forward pass chose it) and, where asked, log-probabilities."""
        with torch.inference_mode():
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
