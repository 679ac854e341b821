"""The Scheduler: four managers and a loop of receive, pick a batch, prepare, forward, handle results.

Only the loop's thread touches the scheduler's state: requests, aborts and cache resets posted from any thread
wait in its inbox (core/scheduler/inbox.py) until the top of the next step, so one posted while the engine runs
joins the very next batch it fits in. Every request that enters gets exactly one final reply, an error included.

Admission counts the KV pages a request is expected to take (core/scheduler/estimate.py): its whole life under
``admission="reserve"``, its prompt and a decaying share of its ``max_tokens`` under ``"estimate"``. A decode step
short of pages preempts the newest running request (preempt.py), queued again and recomputed to the same tokens.
"""

from __future__ import annotations

import random
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import torch

from core.config import EngineConfig
from core.constrain.grammars import Grammars
from core.constrain.masks import grammar_rows
from core.engine.engine import Engine, ForwardOutput
from core.engine.sampler import TokenLogprobs
from core.errors import RequestRejected
from core.models.tokenizer import load_tokenizer
from core.events import StepCallback
from core.request import Batch, Req, SamplingParams
from core.scheduler.admission import Limits, rejection
from core.scheduler.cache import CacheManager
from core.scheduler.decode import DecodeManager
from core.scheduler.estimate import PageEstimate
from core.scheduler.fence import ReleaseFence
from core.scheduler.grammar_step import sample_with_masks, start_masks
from core.scheduler.grammar_wait import grammar_ready, matcher_or_error
from core.scheduler.inbox import AbortRequest, AddRequest, GrammarReady, Inbox, Message
from core.scheduler.leaving import stuck_head, take_out
from core.scheduler.loops import after_current_stream, overlap_loop, plain_loop
from core.scheduler.policy import PhasePolicy
from core.scheduler.prefill import PendingReq, PrefillManager
from core.scheduler.preempt import Preempter
from core.scheduler.prepare import prepare_batch
from core.scheduler.reply import Reply, ReplySink
from core.scheduler.report import StepReporter
from core.scheduler.results import Results, take_tokens
from core.scheduler.stats import scheduler_stats
from core.scheduler.step import InFlight, Prepared
from core.scheduler.table import TableManager


class Scheduler:
    """One rank's loop. Its IO is given at construction: ``send_result`` receives every step's replies (rank 0's
    client: the LLM, or the engine process's outbox), ``exchange`` turns the messages this rank took in into
    those every rank applies (tensor parallelism shares rank 0's; None ends the loop).

    Its public face, all that code outside core/scheduler uses (tests/test_layering.py checks no one reaches
    for an underscore member):

    * running it: ``run_until_idle()``, ``run_until_stopped()`` (until ``stop_requested`` and idle, or until the
      exchange says stop), ``abort(uid)`` on the loop's thread when no loop runs; ``inbox`` takes messages from
      any thread; ``steps_scheduled`` and ``pages_freed_by_last_reset`` say what the loop has done;
    * watching it: ``add_step_callback``, ``add_before_step_callback``, ``report_radix``, ``stats()``;
    * the steps the loops (core/scheduler/loops.py) call: ``wait_for_work``, ``receive``, ``schedule_next_batch``,
      ``launch``, ``take_results``, ``start_masks``, ``hand_out``, ``sample_under_grammar`` and
      ``fail_stuck_requests``, with ``busy``; ``grammars`` holds the requests' compiled constraints (core/constrain/).
    """

    def __init__(self, config: EngineConfig, model_dir: Path, log: Callable[[str], None] | None = None, *,
                 send_result: ReplySink | None = None,
                 exchange: Callable[[list[Message]], list[Message] | None] | None = None) -> None:
        self.config = config
        self.send_result: ReplySink = send_result or (lambda replies: None)
        self._exchange = exchange or (lambda messages: messages)
        self.engine = Engine(config, model_dir, log)
        self.device = self.engine.device
        self.page_size = config.page_size
        self.max_seq_len = self.engine.max_seq_len
        self.overlap = self.engine.plan.overlap
        self.fence = ReleaseFence()
        self.table_manager = TableManager(config.max_running_req, self.max_seq_len, self.device, self.fence)
        self.cache_manager = CacheManager(self.engine.num_pages, self.page_size, self.engine.page_table, config.cache,
                                          self.fence)
        self.decode_manager = DecodeManager()
        self.estimate = PageEstimate(config.admission, self.page_size)  # what admission counts (estimate.py)
        self.prefill_manager = PrefillManager(self.cache_manager, self.table_manager, self.decode_manager,
                                              self.estimate)
        self.preempter = Preempter(self.cache_manager, self.table_manager, self.decode_manager, self.prefill_manager,
                                   self.estimate, self._running)
        self.eos_token_ids = frozenset(self.engine.model_config.eos_token_ids)
        self.vocab_size = self.engine.model_config.vocab_size
        self.inbox = Inbox()
        self.grammars = Grammars(lambda: load_tokenizer(model_dir), self.vocab_size, lambda: self.eos_token_ids,
                                 lambda constraint: self.inbox.post(GrammarReady(constraint)), tokenizer_dir=model_dir)
        self.limits = Limits(self.vocab_size, self.max_seq_len, self.page_size, self.cache_manager.num_pages)
        self.policy = PhasePolicy(config.max_prefill_streak)
        self.reporter = StepReporter(self.cache_manager, self.prefill_manager, config.tp, self._running)
        self.before_step_callbacks: list[Callable[[int], None]] = []
        self.stop_requested = threading.Event()  # leave the loop once idle (the LLM's stop())
        self._scheduled = 0  # steps scheduled so far: the index of the next one
        self._freed_by_reset = 0  # pages the last prefix-cache reset freed on this rank
        self._arrivals = 0  # requests queued so far: each one's arrival order
        self._rng = random.Random()
        # metadata work goes on this stream; forward passes on the engine's (core/scheduler/loops.py)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    # ---- waiting and watching ------------------------------------------------------------------------------
    def wait_for_work(self, stop_when_idle: bool) -> bool:
        """Nothing can run or is in flight: True once there is mail, False to leave (stopping, and nothing queued)."""
        while not self.inbox.has_mail:
            if (stop_when_idle or self.stop_requested.is_set()) and not self.prefill_manager.pending:
                return False
            self.inbox.wait(0.1)
        return True

    @property
    def steps_scheduled(self) -> int:
        """Steps scheduled so far: the index of the next one (the trace's arrivals count in these)."""
        return self._scheduled

    @property
    def pages_freed_by_last_reset(self) -> int:
        """Pages the last prefix-cache reset freed on this rank (0 before any)."""
        return self._freed_by_reset

    @property
    def step_callbacks(self) -> list[StepCallback]:
        """Called with every step's event (core/events.py), on the loop's thread."""
        return self.reporter.callbacks

    def add_step_callback(self, fn: StepCallback) -> None:
        self.reporter.callbacks.append(fn)

    @property
    def report_radix(self) -> bool:
        """Whether step events carry the radix tree (watchers that draw it turn this on)."""
        return self.reporter.report_radix

    @report_radix.setter
    def report_radix(self, on: bool) -> None:
        self.reporter.report_radix = on

    def add_before_step_callback(self, fn: Callable[[int], None]) -> None:
        """``fn(step)`` runs on the loop's thread just before step ``step`` is scheduled: a request it submits
        takes part in that step's scheduling (the trace's step-based arrivals use this)."""
        self.before_step_callbacks.append(fn)

    # ---- requests in (on the loop's thread, from the inbox) -------------------------------------------------
    def receive(self) -> bool:
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
                self.abort(message.uid)
            elif isinstance(message, GrammarReady):
                self.send_result(grammar_ready(message.constraint, self.prefill_manager, self.grammars))
            else:
                self._freed_by_reset = self.cache_manager.reset_prefix_cache()
        return True

    def _add_request(self, uid: int, input_ids: list[int], params: SamplingParams) -> None:
        """Queue a request, or answer it with an error at once if it can never run."""
        matcher, reason = matcher_or_error(params, self.grammars, self.rejection(input_ids, params))
        if reason is not None:
            self.send_result([Reply(uid, None, True, "error", str(reason))])
            return
        seed = params.seed if params.seed is not None else self._rng.getrandbits(62)
        self.prefill_manager.add(PendingReq(uid, list(input_ids), params, seed, matcher, arrival=self._arrivals))
        self._arrivals += 1
        self.reporter.arrived.append(uid)

    def rejection(self, input_ids: list[int], params: SamplingParams) -> RequestRejected | None:
        """Why this request can never run here (ContextLengthError for one too long), or None. Reads only what is
        fixed when the engine is built, so any thread may ask before submitting."""
        return rejection(input_ids, params, self.limits)

    def abort(self, uid: int) -> None:
        """Stop a request wherever it is; its row and pages are freed and it is answered with 'abort'."""
        if take_out(uid, self.prefill_manager, self.decode_manager, self._release):
            self.send_result([Reply(uid, None, True, "abort")])

    @property
    def busy(self) -> bool:
        return self.prefill_manager.runnable or self.decode_manager.runnable

    # ---- the loop -----------------------------------------------------------------------------------------
    def run_until_idle(self) -> None:
        """Run steps, taking in new messages before each, until nothing is queued, running or posted."""
        self._run_loop(stop_when_idle=True)

    def run_until_stopped(self) -> None:
        """Run steps, waiting for messages when there are none, until ``stop_requested`` is set and nothing is
        left, or the exchange ends the loop (a tensor-parallel worker, told by rank 0)."""
        self._run_loop(stop_when_idle=False)

    def _run_loop(self, stop_when_idle: bool) -> None:
        stream = torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()
        with stream, torch.inference_mode():
            (overlap_loop if self.overlap else plain_loop)(self, stop_when_idle)

    def schedule_next_batch(self) -> Prepared | None:
        started = time.perf_counter()
        decoding = self.decode_manager.runnable
        note = self.policy.forced_decode(decoding, lambda: self.prefill_manager.queued(self.config.max_extend_tokens))
        scheduled = None if note else self.prefill_manager.schedule_next_batch(self.config.max_extend_tokens)
        batch, writes = scheduled if scheduled is not None else (self.decode_manager.schedule_next_batch(), [])
        note = self.policy.record(prefilled=scheduled is not None, decoding=decoding) or note
        if batch is not None and batch.is_decode:  # the pool may lack pages for it: preempt (preempt.py)
            batch = self.preempter.make_room(batch, self.fence.in_flight)
        if batch is None:
            return None
        waiting = len(self.prefill_manager.pending)
        dev, input_index, samples = prepare_batch(batch, writes, self.engine, self.table_manager, self.cache_manager,
                                                  self.page_size, self.device)
        self._scheduled += 1
        return Prepared(batch=batch, sample_args=self.engine.sampler.prepare(batch, self.eos_token_ids),
                        input_index=input_index, logits_indices=dev.logits_rows, write_index=dev.write_index,
                        samples=samples, report=self.reporter.record(batch, note, waiting, started,
                                                                    self.preempter.take_report()),
                        grammar=grammar_rows(batch.reqs, samples))

    def launch(self, prepared: Prepared) -> InFlight:
        """Queue the forward pass, then move the bookkeeping on as if it were done (the device keeps order)."""
        batch = prepared.batch
        logits, output = None, None
        with after_current_stream(self.engine.stream, self.device):
            if prepared.input_index is not None:  # the previous step wrote these into the pool: read in order
                batch.input_ids = self.engine.gather_inputs(self.table_manager.flat, prepared.input_index, batch)
            if prepared.grammar is None:
                output = self._send_tokens(prepared, *self.engine.forward_batch(batch, prepared.sample_args,
                                                                         prepared.logits_indices))
            else:  # sampled once its masks are filled (``sample_under_grammar``)
                logits = self.engine.forward(batch, prepared.logits_indices, greedy=False)[0]
        ticket = self.fence.launch()
        for req in batch.reqs:
            req.complete_step()
        self.decode_manager.add(batch.reqs)
        if batch.is_prefill:  # the prompt's KV is on its way: later batches can share it from now on
            for req, samples in zip(batch.reqs, prepared.samples):
                if samples:
                    self.cache_manager.cache_req(req, finished=False)
        return InFlight(prepared, output, ticket, logits)

    def _send_tokens(self, prepared: Prepared, next_tokens: torch.Tensor,
                     logprobs: TokenLogprobs | None) -> ForwardOutput:
        """Sampled tokens into the token pool (the next decode step's inputs) and on their way to the host."""
        self.table_manager.flat[prepared.write_index] = next_tokens
        return self.engine.to_host(next_tokens, logprobs)

    def start_masks(self, flight: InFlight) -> None:
        """A batch under a grammar, launched unsampled: start filling its masks on a worker thread."""
        start_masks(flight, self.vocab_size, self.device)

    def sample_under_grammar(self, flight: InFlight) -> None:
        """A batch under a grammar, launched unsampled: its masks, then its tokens (core/scheduler/grammar_step.py)."""
        sample_with_masks(flight, self.engine, self._send_tokens, self.vocab_size)

    def take_results(self, flight: InFlight) -> Results:
        """Wait for a launched batch and append its tokens to their requests (their matchers moved on)."""
        tokens = flight.output.wait().tolist()
        self.fence.complete(flight.ticket)
        return take_tokens(flight.prepared, tokens, flight.output.logprobs, self.eos_token_ids)

    def hand_out(self, flight: InFlight, results: Results) -> None:
        """The replies of a batch whose tokens were taken; its finished requests give back their rows and pages."""
        replies, finished = results
        for req in finished:
            self.decode_manager.remove(req)
            self.cache_manager.cache_req(req, finished=True)
            self.table_manager.free(req.table_idx)
        self.send_result(replies)
        self.reporter.emit(flight.prepared, tuple(req.uid for req in finished))

    def _release(self, req: Req) -> None:
        self.cache_manager.release(req)
        self.table_manager.free(req.table_idx)

    def fail_stuck_requests(self) -> None:
        """Nothing could be scheduled while requests wait and none decode: the head can never fit. Answer it."""
        reply = stuck_head(self.prefill_manager, self.decode_manager, self._release, self.page_size,
                           self.cache_manager.num_pages)
        if reply is not None:
            self.send_result([reply])

    def _running(self) -> set[Req]:
        """Requests holding a row and pages: those decoding, and those part way through a chunked prompt."""
        return {*self.decode_manager.running,
                *(p.admitted for p in self.prefill_manager.pending if p.admitted is not None)}

    def stats(self) -> dict[str, int | float]:
        """Rows and KV pages now, and the prefix cache's hit rate so far (core/scheduler/stats.py)."""
        return scheduler_stats(self.table_manager, self.cache_manager, self.prefill_manager, self.preempter.total)
