"""The Scheduler: four managers and a loop of receive, pick a batch, prepare, forward, handle results.

Requests, aborts and cache resets arrive as messages in the scheduler's inbox (core/scheduler/inbox.py) from
any thread; the loop takes them in at the top of every step, so only the loop's thread touches its state and a
request posted while the engine runs joins the very next batch it fits in.

One phase per step. Prefill goes first whenever something is waiting and fits, except that after
``max_prefill_streak`` prefill steps in a row while requests are decoding, one decode step is forced: a steady
stream of prompts can delay decoding, never stall it. Every request that enters gets exactly one final reply,
an error included.

Two loops run the same steps. The plain loop finishes each step (launch, wait, handle results) before it
schedules the next. The overlap loop launches step N and only then handles step N-1's results, so the host's
work (results, scheduling, metadata) hides behind the device's. What makes that safe:

* the scheduler's bookkeeping moves on when a batch is launched (``Req.complete_step``), not when its result
  comes back, and sampled tokens go from device to device through the token pool;
* which requests sample this step, and whether a request is finished, are judged from what was scheduled and
  from the tokens the host has received, never from lengths that a later launch already moved on;
* a request that stopped on EOS at step N-1 was already launched again in step N: its extra token is dropped
  (``Req.done``), and the row and pages it gave back wait for step N to finish (``ReleaseFence``);
* on CUDA, metadata is prepared on the scheduler's stream and forward passes run on the engine's stream,
  which waits for the scheduler's before each launch.
"""

from __future__ import annotations

import dataclasses
import random
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from core.config import EngineConfig
from core.engine.engine import Engine, ForwardOutput
from core.engine.sampler import SampleArgs, TokenLogprobs
from core.events import KVUsage, RadixNodeView, ReqStep, StepCallback, StepEvent, WaitReason
from core.request import Batch, Req, SamplingParams
from core.scheduler.cache import CacheManager
from core.scheduler.decode import DecodeManager, pages_for
from core.scheduler.fence import ReleaseFence
from core.scheduler.inbox import AbortRequest, AddRequest, Inbox, Message
from core.scheduler.prefill import PendingReq, PrefillManager
from core.scheduler.report import kv_usage, radix_view, wait_reasons
from core.scheduler.table import TableManager
from core.transfer import upload


@dataclass(frozen=True)
class Reply:
    """One token (or the end) of one request, as the scheduler reports it."""

    uid: int
    token: int | None
    finished: bool
    finish_reason: str | None = None  # 'stop' | 'length' | 'error' | 'abort' when finished
    error: str | None = None
    # for a request that asked (SamplingParams.logprobs): the token's logprob and the top alternatives
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] | None = None
    # for a request whose text the LLM follows (stop strings, or asked for): the text this reply adds, held
    # back while it could be the start of a stop string; and the stop string that ended it
    text: str | None = None
    stop_string: str | None = None


@dataclass
class _Prepared:
    """A scheduled batch with everything its launch needs, and what the step event will report."""

    batch: Batch
    sample_args: SampleArgs
    input_index: torch.Tensor | None  # decode: each input token's place in the flat token pool (read at launch)
    logits_indices: torch.Tensor
    write_index: torch.Tensor  # where each request's sampled token goes in the flat token pool
    samples: list[bool]  # per request: does this step produce its next token (False for a prompt chunk)
    req_steps: tuple[ReqStep, ...]  # lengths as scheduled (the requests move on after the launch)
    note: str
    waiting: int
    pages_used: int
    pages_cached: int
    started: float
    arrived: tuple[int, ...]  # uids queued since the step before
    waits: tuple[WaitReason, ...] = ()
    kv: KVUsage | None = None
    evicted_pages: int = 0


@dataclass
class _InFlight:
    prepared: _Prepared
    output: ForwardOutput
    ticket: int  # the release fence's number for this launch


class Scheduler:
    def __init__(self, config: EngineConfig, model_dir: Path, log: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.engine = Engine(config, model_dir, log)
        self.device = self.engine.device
        self.page_size = config.page_size
        self.max_seq_len = self.engine.max_seq_len
        self.overlap = self.engine.plan.overlap
        self.fence = ReleaseFence()
        self.table_manager = TableManager(config.max_running_req, self.max_seq_len, self.device, self.fence)
        self.cache_manager = CacheManager(self.engine.num_pages, self.page_size, self.engine.page_table, config.cache,
                                          self.fence)
        self.decode_manager = DecodeManager(self.page_size)
        self.prefill_manager = PrefillManager(self.cache_manager, self.table_manager, self.decode_manager,
                                              self.page_size)
        self.token_pool = self.table_manager.token_pool
        self.eos_token_ids = frozenset(self.engine.model_config.eos_token_ids)
        self.vocab_size = self.engine.model_config.vocab_size
        self.step_callbacks: list[StepCallback] = []
        self.before_step_callbacks: list[Callable[[int], None]] = []
        self.inbox = Inbox()
        self._step = 0  # steps reported so far
        self._scheduled = 0  # steps scheduled so far: the index of the next one
        self._arrived: list[int] = []  # uids queued since the last scheduled step
        self._freed_by_reset = 0
        self.report_radix = False  # step events carry the radix tree (set by watchers that draw it)
        self._evicted_reported = 0
        self._born = time.perf_counter()
        self._prefill_streak = 0
        self._rng = random.Random()
        self._last_result_at = 0.0
        # metadata work goes on this stream; forward passes on the engine's (see the module docstring)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    # ---- IO, overridden by the LLM ---------------------------------------------------------------------------
    def send_result(self, replies: list[Reply]) -> None:
        raise NotImplementedError

    def _exchange(self, messages: list[Message]) -> list[Message] | None:
        """The messages every rank applies this step: rank 0's own; tensor parallelism shares them (the LLM).
        None means the loop must end (a tensor-parallel worker told to stop)."""
        return messages

    def _wait_for_work(self, stop_when_idle: bool) -> bool:
        """Called when nothing is queued, running or in flight: True once there is mail to take, False to
        leave the loop (``stop_when_idle``, or the LLM's stop())."""
        while not self.inbox.has_mail:
            if stop_when_idle:
                return False
            self.inbox.wait(0.1)
        return True

    def add_step_callback(self, fn: StepCallback) -> None:
        self.step_callbacks.append(fn)

    def add_before_step_callback(self, fn: Callable[[int], None]) -> None:
        """``fn(step)`` runs on the loop's thread just before step ``step`` is scheduled: a request it submits
        takes part in that step's scheduling (the trace's step-based arrivals use this)."""
        self.before_step_callbacks.append(fn)

    # ---- requests in (on the loop's thread, from the inbox) -------------------------------------------------
    def _receive(self) -> bool:
        """Take in every message posted since the last step; False if the loop must end."""
        for fn in self.before_step_callbacks:
            fn(self._scheduled)
        messages = self._exchange(self.inbox.take_all())
        if messages is None:
            return False
        for message in messages:
            if isinstance(message, AddRequest):
                self._add_request(message.uid, list(message.input_ids), message.params)
            elif isinstance(message, AbortRequest):
                self._abort(message.uid)
            else:
                self._freed_by_reset = self._reset_prefix_cache()
        return True

    def _add_request(self, uid: int, input_ids: list[int], params: SamplingParams) -> None:
        """Queue a request, or answer it with an error at once if it can never run."""
        reason = self.rejection(input_ids, params)
        if reason is not None:
            self.send_result([Reply(uid, None, True, "error", reason)])
            return
        seed = params.seed if params.seed is not None else self._rng.getrandbits(62)
        self.prefill_manager.add(PendingReq(uid, list(input_ids), params, seed))
        self._arrived.append(uid)

    def rejection(self, input_ids: list[int], params: SamplingParams) -> str | None:
        """Why this request can never run here, or None. Reads only what is fixed when the engine is built, so
        any thread may ask before submitting."""
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

    def _abort(self, uid: int) -> bool:
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
            req.done = True  # a batch in flight may still hold it: its result is dropped
            self._release(req)
        self.send_result([Reply(uid, None, True, "abort")])
        return True

    @property
    def busy(self) -> bool:
        return self.prefill_manager.runnable or self.decode_manager.runnable

    # ---- the loop -----------------------------------------------------------------------------------------
    def run_until_idle(self) -> None:
        """Run steps, taking in new messages before each, until nothing is queued, running or posted."""
        self._run_loop(stop_when_idle=True)

    def _run_loop(self, stop_when_idle: bool) -> None:
        with self._scheduler_stream(), torch.inference_mode():
            if self.overlap:
                self._overlap_loop(stop_when_idle)
            else:
                self._plain_loop(stop_when_idle)

    def _plain_loop(self, stop_when_idle: bool) -> None:
        """Each step finishes (launch, wait, handle results) before the next is scheduled."""
        while True:
            if not self.busy and not self._wait_for_work(stop_when_idle):
                return
            if not self._receive():
                return
            if not self.busy:
                continue
            prepared = self._schedule_next_batch()
            if prepared is None:
                self._fail_stuck_requests()
                continue
            self._finish(self._launch(prepared))

    def _overlap_loop(self, stop_when_idle: bool) -> None:
        """Launch step N, then handle step N-1's results while step N runs."""
        last: _InFlight | None = None
        while True:
            if last is None and not self.busy and not self._wait_for_work(stop_when_idle):
                return
            if not self._receive():
                if last is not None:
                    self._finish(last)
                return
            prepared = self._schedule_next_batch() if self.busy else None
            current = self._launch(prepared) if prepared is not None else None
            if last is not None:
                self._finish(last)  # frees made here wait for ``current``
            elif current is None:
                self._fail_stuck_requests()  # nothing in flight, nothing held: the head can never fit
            last = current

    @contextmanager
    def _scheduler_stream(self) -> Iterator[None]:
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            yield

    @contextmanager
    def _engine_stream(self) -> Iterator[None]:
        stream = self.engine.stream
        if stream is None:
            yield
            return
        stream.wait_stream(torch.cuda.current_stream(self.device))  # the metadata this launch reads
        with torch.cuda.stream(stream):
            yield

    def _schedule_next_batch(self) -> _Prepared | None:
        started = time.perf_counter()
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
        else:
            batch, writes = self.decode_manager.schedule_next_batch(), []
            self._prefill_streak = 0
            if batch is None:
                return None
        prepared = self._prepare(batch, writes, note, waiting, started)
        if self.step_callbacks:
            in_batch = {r.uid for r in batch.reqs}
            queued = [p for p in self.prefill_manager.pending if p.uid not in in_batch]
            prepared.waits = wait_reasons(queued, self.prefill_manager.refusal, note)
            running = {*self.decode_manager.running, *batch.reqs,
                       *(p.started for p in self.prefill_manager.pending if p.started is not None)}
            prepared.kv = kv_usage(running, self.cache_manager.prefix_cache, self.cache_manager.num_pages)
            evicted = self.cache_manager.evicted_pages
            prepared.evicted_pages, self._evicted_reported = evicted - self._evicted_reported, evicted
        return prepared

    def _prepare(self, batch: Batch, writes: list[tuple[int, int, list[int]]], note: str, waiting: int,
                 started: float) -> _Prepared:
        """Pages, then every index the step needs, sent to the device in one upload."""
        self.cache_manager.allocate(batch.reqs)
        reqs = batch.reqs
        n = len(reqs)
        width = self.table_manager.width
        samples = [not r.is_chunked for r in reqs]
        write_index = [r.table_idx * width + (r.device_len if s else self.table_manager.scratch_col)
                       for r, s in zip(reqs, samples)]
        if batch.is_prefill:
            host, total = self._prefill_indices(writes, write_index)
        else:
            host, total = self._decode_indices(batch, write_index)
        dev = upload(host, self.device)
        batch.positions = dev[total:2 * total]
        if batch.is_prefill:  # a prefill's inputs are prompt tokens: the host has them; the pool keeps a copy
            token_rows, batch.input_ids = dev[:total], dev[2 * total:3 * total]
            self.table_manager.flat[dev[3 * total:4 * total]] = batch.input_ids
            batch.out_loc = self.engine.page_table[token_rows, batch.positions]
            input_index, rest = None, dev[4 * total:]
        else:
            input_index, batch.out_loc, rest = dev[:total], dev[2 * total:3 * total], dev[3 * total:]
        self.engine.attn_backend.prepare_metadata(batch)
        req_steps = tuple(ReqStep(r.uid, r.extend_len, r.cached_len) for r in reqs) if self.step_callbacks else ()
        arrived, self._arrived = tuple(self._arrived), []
        self._scheduled += 1
        return _Prepared(batch, self.engine.sampler.prepare(batch), input_index, rest[n:], rest[:n], samples,
                         req_steps, note, waiting, self.cache_manager.used_pages, self.cache_manager.cached_pages,
                         started, arrived)

    def _prefill_indices(self, writes: list[tuple[int, int, list[int]]],
                         write_index: list[int]) -> tuple[torch.Tensor, int]:
        """[token rows | positions | prompt tokens | their token-pool places | sample places | logits rows],
        built with a few host tensor ops rather than a Python loop over every token."""
        lengths = torch.tensor([len(tokens) for _, _, tokens in writes], dtype=torch.int64)
        total = int(lengths.sum())
        ends = lengths.cumsum(0)
        rows = torch.tensor([row for row, _, _ in writes], dtype=torch.int64)
        starts = torch.tensor([start for _, start, _ in writes], dtype=torch.int64)
        token_rows = torch.repeat_interleave(rows, lengths, output_size=total)
        positions = torch.arange(total) + torch.repeat_interleave(starts - (ends - lengths), lengths,
                                                                  output_size=total)
        values = torch.tensor([t for _, _, tokens in writes for t in tokens], dtype=torch.int64)
        host = torch.cat([token_rows, positions, values, token_rows * self.table_manager.width + positions,
                          torch.tensor(write_index, dtype=torch.int64), ends - 1])
        return host, total

    def _decode_indices(self, batch: Batch, write_index: list[int]) -> tuple[torch.Tensor, int]:
        """[input places | positions | KV slots | sample places | logits rows]: one token per request, so the
        KV slot is read off the request's page list here instead of gathered from the page table there. Under
        CUDA graphs, padding rows read the spare row at position 0 and write the dummy page."""
        reqs = batch.reqs
        batch.padded_size = self.engine.padded_size(batch)
        pad = batch.padded_size - len(reqs)
        size, width = self.page_size, self.table_manager.width
        positions = [r.cached_len for r in reqs]  # the new token's position: device_len - 1
        slots = [r.pages[p // size] * size + p % size for r, p in zip(reqs, positions)]
        inputs = [r.table_idx * width + p for r, p in zip(reqs, positions)]
        host = torch.tensor(inputs + [self.table_manager.pad_row * width] * pad + positions + [0] * pad
                            + slots + [self.engine.dummy_page * size] * pad + write_index
                            + list(range(len(reqs))), dtype=torch.int64)
        return host, batch.padded_size

    def _launch(self, prepared: _Prepared) -> _InFlight:
        """Queue the forward pass, then move the bookkeeping on as if it were done (the device keeps order)."""
        batch = prepared.batch
        pool = self.table_manager.flat
        with self._engine_stream():
            if prepared.input_index is not None:  # the previous step wrote these into the pool: read in order
                batch.input_ids = pool[prepared.input_index]
            next_tokens, logprobs = self.engine.forward_batch(batch, prepared.sample_args, prepared.logits_indices)
            pool[prepared.write_index] = next_tokens
            output = self.engine.to_host(next_tokens, logprobs)
        ticket = self.fence.launch()
        for req in batch.reqs:
            req.complete_step()
        self.decode_manager.add(batch.reqs)
        if batch.is_prefill:  # the prompt's KV is on its way: later batches can share it from now on
            for req, samples in zip(batch.reqs, prepared.samples):
                if samples:
                    self.cache_manager.cache_req(req, finished=False)
        return _InFlight(prepared, output, ticket)

    def _finish(self, flight: _InFlight) -> None:
        """Wait for a launched batch, hand back what waited for it, and handle its tokens."""
        tokens = flight.output.wait().tolist()
        self.fence.complete(flight.ticket)
        finished = self._process_results(flight.prepared, tokens, flight.output.logprobs)
        self._emit(flight.prepared, finished)

    def _process_results(self, prepared: _Prepared, tokens: list[int],
                         logprobs: TokenLogprobs | None = None) -> list[int]:
        replies: list[Reply] = []
        finished: list[int] = []
        for row, (req, token, samples) in enumerate(zip(prepared.batch.reqs, tokens, prepared.samples)):
            if not samples or req.done:  # a prompt chunk, or a request already answered
                continue
            req.input_ids.append(token)
            req.output_ids.append(token)
            reason = None
            if not req.params.ignore_eos and token in self.eos_token_ids:
                reason = "stop"
            elif len(req.input_ids) >= req.max_device_len:  # tokens received, not the (further) scheduled length
                reason = "length"
            reply = Reply(req.uid, token, reason is not None, reason)
            if logprobs is not None and req.params.logprobs is not None:
                chosen, top = logprobs.row(row, req.params.logprobs)
                reply = dataclasses.replace(reply, logprob=chosen, top_logprobs=top)
            replies.append(reply)
            if reason is not None:
                req.done = True
                finished.append(req.uid)
                self.decode_manager.remove(req)
                self.cache_manager.cache_req(req, finished=True)
                self.table_manager.free(req.table_idx)
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

    def _emit(self, prepared: _Prepared, finished: list[int]) -> None:
        """Report the step. Its time runs from when it was scheduled, or, when steps overlap, from the previous
        step's result: the time between results, which is what a step costs once the pipeline is full."""
        now = time.perf_counter()
        elapsed = now - max(prepared.started, self._last_result_at)
        self._last_result_at = now
        if not self.step_callbacks:
            self._step += 1
            return
        batch = prepared.batch
        event = StepEvent(
            step=self._step, phase=batch.phase, batch_size=batch.size, num_tokens=len(batch.positions) if
            batch.is_prefill else batch.size, reqs=prepared.req_steps,
            kv_pages_used=prepared.pages_used, kv_pages_total=self.cache_manager.num_pages,
            elapsed_s=elapsed, tp_size=self.config.tp, note=prepared.note, finished=tuple(finished),
            waiting=prepared.waiting, kv_pages_cached=prepared.pages_cached, arrived=prepared.arrived,
            waits=prepared.waits, kv=prepared.kv, evicted_pages=prepared.evicted_pages,
            radix=self._radix_now() if self.report_radix else None, started_s=prepared.started - self._born)
        self._step += 1
        for fn in self.step_callbacks:
            fn(event)

    def _radix_now(self) -> tuple[RadixNodeView, ...]:
        running = {*self.decode_manager.running,
                   *(p.started for p in self.prefill_manager.pending if p.started is not None)}
        return radix_view(running, self.cache_manager.prefix_cache)

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

    def _reset_prefix_cache(self) -> int:
        """Empty the prefix cache; returns the pages freed.

        Safe at any step: pages that a running request reads are locked and stay until it lets go of them.
        """
        before = self.cache_manager.free_pages
        self.cache_manager.reset_prefix_cache()
        return self.cache_manager.free_pages - before
