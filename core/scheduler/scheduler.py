"""The Scheduler: four managers and a loop of receive, pick a batch, prepare, forward, handle results.

One phase per step. Prefill goes first whenever something is waiting and fits, except that after
``max_prefill_streak`` prefill steps in a row while requests are decoding, one decode step is forced: a steady
stream of prompts can delay decoding, never stall it. Every request that enters gets exactly one final reply,
an error included.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from core.config import EngineConfig
from core.engine.engine import Engine, ForwardOutput
from core.events import ReqStep, StepCallback, StepEvent
from core.request import Batch, Req, SamplingParams
from core.scheduler.cache import CacheManager
from core.scheduler.decode import DecodeManager, pages_for
from core.scheduler.prefill import PendingReq, PrefillManager
from core.scheduler.table import TableManager


@dataclass(frozen=True)
class Reply:
    """One token (or the end) of one request, as the scheduler reports it."""

    uid: int
    token: int | None
    finished: bool
    finish_reason: str | None = None  # 'stop' | 'length' | 'error' | 'abort' when finished
    error: str | None = None


@dataclass
class _Prepared:
    batch: Batch
    sample_args: object
    logits_indices: torch.Tensor
    write_rows: torch.Tensor
    write_cols: torch.Tensor
    req_steps: tuple[ReqStep, ...]  # lengths as scheduled (the requests move on after the forward)
    note: str
    waiting: int
    pages_used: int
    pages_cached: int


class Scheduler:
    def __init__(self, config: EngineConfig, model_dir: Path, log: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.engine = Engine(config, model_dir, log)
        self.device = self.engine.device
        self.page_size = config.page_size
        self.max_seq_len = self.engine.max_seq_len
        self.table_manager = TableManager(config.max_running_req, self.max_seq_len, self.device)
        self.cache_manager = CacheManager(self.engine.num_pages, self.page_size, self.engine.page_table, config.cache)
        self.decode_manager = DecodeManager(self.page_size)
        self.prefill_manager = PrefillManager(self.cache_manager, self.table_manager, self.decode_manager,
                                              self.page_size)
        self.token_pool = self.table_manager.token_pool
        self.eos_token_ids = frozenset(self.engine.model_config.eos_token_ids)
        self.vocab_size = self.engine.model_config.vocab_size
        self.step_callbacks: list[StepCallback] = []
        self._step = 0
        self._prefill_streak = 0
        self._rng = random.Random()

    # ---- IO, overridden by the offline LLM -----------------------------------------------------------------
    def send_result(self, replies: list[Reply]) -> None:
        raise NotImplementedError

    def add_step_callback(self, fn: StepCallback) -> None:
        self.step_callbacks.append(fn)

    # ---- requests in --------------------------------------------------------------------------------------
    def submit(self, uid: int, input_ids: list[int], params: SamplingParams) -> None:
        """Queue a request, or answer it with an error at once if it can never run."""
        error = self._reject_reason(input_ids, params)
        if error is not None:
            self.send_result([Reply(uid, None, True, "error", error)])
            return
        seed = params.seed if params.seed is not None else self._rng.getrandbits(62)
        self.prefill_manager.add(PendingReq(uid, list(input_ids), params, seed))

    def _reject_reason(self, input_ids: list[int], params: SamplingParams) -> str | None:
        if not input_ids:
            return "empty prompt: give at least one token"
        bad = next((t for t in input_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            return f"token id {bad} is outside the vocabulary [0, {self.vocab_size})"
        total = len(input_ids) + params.max_tokens
        if total > self.max_seq_len:
            return (f"prompt of {len(input_ids)} tokens plus max_tokens={params.max_tokens} exceeds the context of "
                    f"{self.max_seq_len} tokens")
        pages = pages_for(total - 1, self.page_size)  # the last sampled token is never fed back: no KV
        if pages > self.cache_manager.num_pages:
            return (f"prompt of {len(input_ids)} tokens plus max_tokens={params.max_tokens} needs {pages} KV pages "
                    f"but the pool has only {self.cache_manager.num_pages}")
        return None

    def abort(self, uid: int) -> bool:
        """Stop a request wherever it is; its row and pages are freed and it is answered with 'abort'."""
        pending = self.prefill_manager.find(uid)
        req = None
        if pending is not None:
            self.prefill_manager.remove(pending)
            req = pending.started
        else:
            req = self.decode_manager.find(uid)
            if req is None:
                return False
            self.decode_manager.remove(req)
        if req is not None:
            self._release(req)
        self.send_result([Reply(uid, None, True, "abort")])
        return True

    @property
    def busy(self) -> bool:
        return self.prefill_manager.runnable or self.decode_manager.runnable

    # ---- the loop -----------------------------------------------------------------------------------------
    def run_until_idle(self) -> None:
        while self.busy:
            self.step()

    def step(self) -> None:
        started = time.perf_counter()
        prepared = self._schedule_next_batch()
        if prepared is None:
            self._fail_stuck_requests()
            return
        output = self._forward(prepared)
        finished = self._process_results(prepared.batch, output)
        self._emit(prepared, finished, time.perf_counter() - started)

    def _schedule_next_batch(self) -> _Prepared | None:
        note = ""
        decoding = self.decode_manager.runnable
        if decoding and self._prefill_streak >= self.config.max_prefill_streak:
            note = f"decode forced after {self._prefill_streak} prefill steps"
            scheduled = None
        else:
            scheduled = self.prefill_manager.schedule_next_batch(self.config.max_extend_tokens)
        waiting = len(self.prefill_manager.pending)
        if scheduled is not None:
            batch, writes = scheduled
            self._prefill_streak = self._prefill_streak + 1 if decoding else 0
            self._write_prompt_tokens(writes)
        else:
            batch = self.decode_manager.schedule_next_batch()
            self._prefill_streak = 0
            if batch is None:
                return None
        return self._prepare(batch, note, waiting)

    def _write_prompt_tokens(self, writes: list[tuple[int, int, list[int]]]) -> None:
        rows, cols, values = [], [], []
        for row, start, tokens in writes:
            rows.extend([row] * len(tokens))
            cols.extend(range(start, start + len(tokens)))
            values.extend(tokens)
        self.token_pool[self._to_device(rows), self._to_device(cols)] = self._to_device(values, torch.int32)

    def _to_device(self, values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

    def _prepare(self, batch: Batch, note: str, waiting: int) -> _Prepared:
        self.cache_manager.allocate(batch.reqs)
        rows, positions, last = [], [], []
        for req in batch.reqs:
            rows.extend([req.table_idx] * req.extend_len)
            positions.extend(range(req.cached_len, req.device_len))
            last.append(len(positions) - 1)
        rows_t, pos_t = self._to_device(rows), self._to_device(positions)
        batch.positions = pos_t
        batch.input_ids = self.token_pool[rows_t, pos_t]
        batch.out_loc = self.engine.page_table[rows_t, pos_t]
        self.engine.attn_backend.prepare_metadata(batch)
        scratch = self.table_manager.scratch_col
        write_rows = self._to_device([r.table_idx for r in batch.reqs])
        write_cols = self._to_device([scratch if r.is_chunked else r.device_len for r in batch.reqs])
        req_steps = tuple(ReqStep(r.uid, r.extend_len, r.cached_len) for r in batch.reqs)
        return _Prepared(batch, self.engine.sampler.prepare(batch), self._to_device(last), write_rows, write_cols,
                         req_steps, note, waiting, self.cache_manager.used_pages, self.cache_manager.cached_pages)

    def _forward(self, prepared: _Prepared) -> ForwardOutput:
        batch = prepared.batch
        output = self.engine.forward_batch(batch, prepared.sample_args, prepared.logits_indices)
        self.token_pool[prepared.write_rows, prepared.write_cols] = output.next_tokens
        for req in batch.reqs:
            req.complete_step()
        self.decode_manager.add(batch.reqs)
        return output

    def _process_results(self, batch: Batch, output: ForwardOutput) -> list[int]:
        tokens = output.wait().tolist()
        replies: list[Reply] = []
        finished: list[int] = []
        for req, token in zip(batch.reqs, tokens):
            if req.is_chunked:
                continue
            req.input_ids.append(token)
            req.output_ids.append(token)
            reason = None
            if not req.params.ignore_eos and token in self.eos_token_ids:
                reason = "stop"
            elif len(req.input_ids) >= req.max_device_len:
                reason = "length"
            replies.append(Reply(req.uid, token, reason is not None, reason))
            if reason is not None:
                finished.append(req.uid)
                self.decode_manager.remove(req)
                self.cache_manager.cache_req(req, finished=True)
                self.table_manager.free(req.table_idx)
            elif batch.is_prefill:
                self.cache_manager.cache_req(req, finished=False)
        self.send_result(replies)
        return finished

    def _release(self, req: Req) -> None:
        self.cache_manager.release(req)
        self.table_manager.free(req.table_idx)

    def _fail_stuck_requests(self) -> None:
        """Nothing could be scheduled while requests wait and none decode: the head can never fit. Answer it."""
        if self.decode_manager.runnable or not self.prefill_manager.pending:
            return
        pending = self.prefill_manager.pending[0]
        self.prefill_manager.remove(pending)
        if pending.started is not None:
            self._release(pending.started)
        self.send_result([Reply(pending.uid, None, True, "error",
                                f"request needs more KV pages than the pool can ever free "
                                f"({pages_for(pending.max_kv_len, self.page_size)} needed, "
                                f"{self.cache_manager.num_pages} in the pool)")])

    def _emit(self, prepared: _Prepared, finished: list[int], elapsed: float) -> None:
        batch = prepared.batch
        event = StepEvent(
            step=self._step, phase=batch.phase, batch_size=batch.size, num_tokens=len(batch.positions),
            reqs=prepared.req_steps,
            kv_pages_used=prepared.pages_used, kv_pages_total=self.cache_manager.num_pages,
            elapsed_s=elapsed, tp_size=self.config.tp, note=prepared.note, finished=tuple(finished),
            waiting=prepared.waiting, kv_pages_cached=prepared.pages_cached)
        self._step += 1
        for fn in self.step_callbacks:
            fn(event)

    # ---- introspection ------------------------------------------------------------------------------------
    def stats(self) -> dict[str, int | float]:
        """Rows and KV pages now, and the prefix cache's hit rate so far (cached prompt tokens / prompt tokens)."""
        prefill = self.prefill_manager
        return {
            "free_rows": self.table_manager.available,
            "total_rows": self.table_manager.total_rows,
            "free_pages": self.cache_manager.free_pages,
            "cached_pages": self.cache_manager.cached_pages,
            "total_pages": self.cache_manager.num_pages,
            "evicted_pages": self.cache_manager.evicted_pages,
            "prompt_tokens": prefill.prompt_tokens,
            "cached_prompt_tokens": prefill.cached_prompt_tokens,
            "hit_rate": prefill.cached_prompt_tokens / prefill.prompt_tokens if prefill.prompt_tokens else 0.0,
        }

    def reset_prefix_cache(self) -> int:
        """Empty the prefix cache; returns the pages freed.

        Safe at any time: pages that a running request reads are locked and stay until it lets go of them.
        """
        before = self.cache_manager.free_pages
        self.cache_manager.reset_prefix_cache()
        return self.cache_manager.free_pages - before
