"""The engine's interface: submit requests while its loop runs, or complete a list of prompts with generate().

LLM is a Scheduler whose IO is in memory. ``submit`` (any thread) posts a request to the scheduler's inbox and
returns its uid; the loop (``run_until_idle``, or ``serve_forever`` on a thread of its own) takes it in before
its next step, and every token and the final reply reach the request's ``on_reply`` callback. ``generate`` is
submit for each prompt, then the loop until idle: the same path a server takes, so testing the offline
interface tests the online one.

With ``tp=N > 1`` the LLM is rank 0 of N tensor-parallel ranks: it starts the other N-1 as worker processes,
sends each call's requests to them, and every rank runs this same loop (core/llm/tp_group.py starts and
drives them, core/llm/tp_worker.py is their side).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from core.config import EngineConfig
from core.distributed.info import tp_scope
from core.errors import EngineBusyError, InvalidParamsError, ModelLoadError, one_line
from core.llm.arrivals import Arrival, ArrivalFeeder
from core.llm.collect import Collected
from core.llm.tp_group import start_group
from core.models.random_spec import ByteTokenizer, RandomSpec
from core.models.weights import declared_tokenizer, resolve_model_dir
from core.request import Prompt, Result, SamplingParams
from core.scheduler.inbox import AbortRequest, AddRequest, Message, ResetPrefixCache
from core.llm.text import TextStream
from core.scheduler.reply import Reply
from core.scheduler.scheduler import Scheduler

ReplyCallback = Callable[[Reply], None]


@dataclass
class _Route:
    """Where a request's replies go, and its text when the LLM follows it (stop strings, or asked for)."""

    on_reply: ReplyCallback | None
    text: TextStream | None = None


def load_tokenizer(model_dir: Path | RandomSpec) -> Any:
    if isinstance(model_dir, RandomSpec):
        return ByteTokenizer()
    from transformers import AutoTokenizer

    try:
        return declared_tokenizer(model_dir) or AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer from {model_dir}: {one_line(exc)}") from exc


class LLM(Scheduler):
    """``LLM(model=None | path | 'random:NAME', ...)``: None is the embedded SmolLM2-135M-Instruct; a random
    spec builds a known shape with random weights and reads prompts as token ids or UTF-8 bytes.

    ``tp=N`` splits the model over N ranks: N-1 worker processes on the CPU (gloo) or N GPUs (NCCL, rank r on
    GPU r). Call ``close()`` (or use ``with LLM(...) as llm``) to stop them; they are also stopped when the LLM
    is garbage-collected and at interpreter exit. A script that uses ``tp > 1`` needs the usual
    ``if __name__ == "__main__":`` guard, since the workers are started with spawn.
    """

    def __init__(self, model: str | None = None, *, cache: str = "radix", page_size: int = 1,
                 max_running_req: int = 32, num_pages: int | None = None, max_seq_len: int | None = None,
                 max_extend_tokens: int = 8192, dtype: Any = None, device: str | None = None,
                 attention: str | None = None, kv_cache_gb: float | None = None,
                 cuda_graph_max_bs: int | None = None, max_prefill_streak: int = 8, tp: int = 1,
                 overlap: bool | None = None, kv_dtype: str = "auto", precision: str = "exact",
                 log: Callable[[str], None] | None = None) -> None:
        config = EngineConfig(model=model, cache=cache, page_size=page_size, max_running_req=max_running_req,
                              num_pages=num_pages, kv_cache_gb=kv_cache_gb, max_seq_len=max_seq_len,
                              max_extend_tokens=max_extend_tokens, dtype=dtype, device=device, attention=attention,
                              cuda_graph_max_bs=cuda_graph_max_bs, max_prefill_streak=max_prefill_streak, tp=tp,
                              overlap=overlap, kv_dtype=kv_dtype, precision=precision)
        model_dir = resolve_model_dir(model, log)
        self.model_dir = model_dir
        self.tokenizer = load_tokenizer(model_dir)
        self._group = start_group(config, model_dir)
        weakref.finalize(self, self._group.close)
        with self._group.guard(), tp_scope(self._group.info):
            super().__init__(self._group.config, model_dir, log)
            self._group.wait_ready()
        self._lock = threading.RLock()  # guards the uid counter, the routes and the seed generator
        self._next_uid = 0
        self._routes: dict[int, _Route] = {}  # every request submitted and not yet answered
        self._reply_callbacks: list[ReplyCallback] = []
        self._loop_thread: int | None = None  # the thread running the loop, while one does

    # ---- requests in: any thread -------------------------------------------------------------------------
    def submit(self, prompt: Prompt, sampling_params: SamplingParams | None = None, *,
               on_reply: ReplyCallback | None = None, text: bool = False) -> int:
        """Queue one request and return its uid. Safe from any thread, also while the loop runs: the loop takes
        it in before its next step. ``on_reply`` gets every token and then exactly one final reply (finished,
        with finish_reason 'stop', 'length', 'abort' or 'error' and its message), on the loop's thread.

        With ``text=True`` (implied by stop strings) every reply also carries the text it adds (``Reply.text``),
        detokenized incrementally; the pieces join to the request's whole text. A stop string ends the request
        with finish_reason 'stop', its text cut before the stop string (``Reply.stop_string`` says which).

        A prompt that can never run here (too long, a token outside the vocabulary) is answered with an
        'error' reply; ``rejection()`` tells that before submitting."""
        params = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidParamsError("sampling_params must be SamplingParams")
        return self._submit_ids(self.tokenize(prompt), params, on_reply, text)

    def _submit_ids(self, input_ids: list[int], params: SamplingParams, on_reply: ReplyCallback | None,
                    text: bool = False) -> int:
        stream = TextStream(self.tokenizer, input_ids, params.stop) if text or params.stop else None
        with self._lock:
            uid = self._next_uid
            self._next_uid += 1
            self._routes[uid] = _Route(on_reply, stream)
            if params.seed is None:  # rank 0 decides every seed, so all tensor-parallel ranks sample alike
                params = dataclasses.replace(params, seed=self._rng.getrandbits(62))
        self.inbox.post(AddRequest(uid, tuple(input_ids), params))
        return uid

    def abort(self, uid: int) -> bool:
        """Stop request ``uid``, from any thread. True if it was still unanswered: its final reply (finish_reason
        'abort', with the tokens produced so far) is delivered now, and its row and pages are freed before the
        next step. False for an unknown or already finished request."""
        with self._lock:
            if uid not in self._routes:
                return False
            self.inbox.post(AbortRequest(uid))
            self._deliver(Reply(uid, None, True, "abort"))
        return True

    def add_reply_callback(self, fn: ReplyCallback) -> None:
        """Called for every reply of every request (each new token and each finish), after the request's own
        ``on_reply``: progress bars use this."""
        self._reply_callbacks.append(fn)

    def tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        if isinstance(prompt, (list, tuple)) and _all_token_ids(prompt):
            return list(prompt)
        raise InvalidParamsError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    # ---- replies out: the loop's thread ------------------------------------------------------------------
    def send_result(self, replies: list[Reply]) -> None:
        with self._lock:
            for reply in replies:
                if reply.uid in self._routes:  # else unknown, or already answered (aborted)
                    self._deliver(reply)

    def _deliver(self, reply: Reply) -> None:
        route = self._routes[reply.uid]
        if route.text is not None:
            reply = self._with_text(reply, route.text)
        if reply.finished:
            del self._routes[reply.uid]
        if route.on_reply is not None:
            route.on_reply(reply)
        for fn in self._reply_callbacks:
            fn(reply)

    def _with_text(self, reply: Reply, stream: TextStream) -> Reply:
        """The reply with the text its token adds; a stop string turns it into the request's final reply and
        has the loop free the request before its next step (on every rank, like any abort)."""
        pieces = []
        if reply.token is not None and reply.token not in self.eos_token_ids:
            piece = stream.add(reply.token)
            pieces.append(piece.text)
            if piece.stop is not None:
                if not reply.finished:
                    self.inbox.post(AbortRequest(reply.uid))
                return dataclasses.replace(reply, finished=True, finish_reason="stop", text=piece.text,
                                           stop_string=piece.stop)
        if reply.finished:
            pieces.append(stream.finish().text)
        return dataclasses.replace(reply, text="".join(pieces))

    @property
    def precision_note(self) -> str:
        """What ``precision='fast'`` (or 'int8') came to on this machine, in one line; empty for 'exact'."""
        return self.engine.precision_note

    @property
    def unanswered(self) -> int:
        """Requests submitted and not yet answered with their final reply."""
        with self._lock:
            return len(self._routes)

    # ---- the loop ----------------------------------------------------------------------------------------
    def run_until_idle(self) -> None:
        """Run the loop on this thread until nothing is queued, running or posted."""
        with self._owning_the_loop():
            super().run_until_idle()

    def serve_forever(self) -> None:
        """Run the loop on this thread, waiting for requests when there are none, until ``stop()``; then it
        finishes every request already submitted and returns."""
        self.stop_requested.clear()
        with self._owning_the_loop():
            self._run_loop(stop_when_idle=False)

    def stop(self) -> None:
        """Have ``serve_forever`` return once every submitted request is answered. Safe from any thread."""
        self.stop_requested.set()
        self.inbox.wake()

    def _exchange(self, messages: list[Message]) -> list[Message] | None:
        return self._group.share(messages, self.eos_token_ids)

    @property
    def loop_running_elsewhere(self) -> bool:
        return self._loop_thread is not None and self._loop_thread != threading.get_ident()

    @contextmanager
    def _owning_the_loop(self) -> Iterator[None]:
        """One loop at a time, on one thread; tensor-parallel failures inside it become WorkerError."""
        with self._lock:
            if self._loop_thread is not None:
                raise EngineBusyError("the engine loop is already running"
                                      + (" on another thread" if self.loop_running_elsewhere else ""))
            self._loop_thread = threading.get_ident()
        try:
            with self._group.guard():
                yield
        finally:
            self._loop_thread = None

    # ---- offline: a list of prompts ----------------------------------------------------------------------
    def generate(self, prompts: Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 arrivals: Sequence[Arrival | None] | None = None) -> list[Result]:
        """Complete every prompt; results come back in prompt order, one per prompt, errors included.

        ``arrivals`` (one per prompt, None for "at the start") lets requests enter while the others run: before a
        given step, or some seconds after the start (core/llm/arrivals.py). If ``serve_forever`` runs on another
        thread, the requests join its loop and this waits for them; otherwise this thread runs the loop."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise InvalidParamsError("prompts must be a list of strings or of token-id lists")
        params = self._params_per_prompt(prompts, sampling_params)
        if arrivals is not None and len(arrivals) != len(prompts):
            raise InvalidParamsError(f"got {len(arrivals)} arrivals for {len(prompts)} prompts")
        prompt_ids = [self.tokenize(p) for p in prompts]  # every prompt checked before any is queued
        collected = [Collected(len(ids), frozenset(self.eos_token_ids)) for ids in prompt_ids]
        uids: list[int | None] = [None] * len(prompts)

        def submit(indices: list[int]) -> None:
            for i in indices:
                uids[i] = self._submit_ids(prompt_ids[i], params[i], collected[i].on_reply)

        try:
            if arrivals is None or self.loop_running_elsewhere:
                submit(list(range(len(prompts))))  # a loop of its own: arrivals are its clients' business
                if self.loop_running_elsewhere:
                    for got in collected:
                        got.done.wait()
                else:
                    self.run_until_idle()
            else:
                self._run_arrivals(ArrivalFeeder(arrivals, self._scheduled), submit)
        except BaseException:  # Ctrl-C or an error mid-run: free what this call holds, so the LLM stays usable
            self._abandon([uid for uid in uids if uid is not None])
            raise
        return [self._result(uid, got) for uid, got in zip(uids, collected)]

    def _run_arrivals(self, feeder: ArrivalFeeder, submit: Callable[[list[int]], None]) -> None:
        def at_step(step: int) -> None:
            submit(feeder.due(step))

        submit(feeder.due(self._scheduled))
        self.before_step_callbacks.append(at_step)
        try:
            while True:
                self.run_until_idle()
                if feeder.done:
                    return
                submit(feeder.next_when_idle())  # the engine ran out of work before the next arrival
        finally:
            self.before_step_callbacks.remove(at_step)

    def _abandon(self, uids: list[int]) -> None:
        if self.loop_running_elsewhere:  # that loop frees them
            for uid in uids:
                self.abort(uid)
            return
        self.inbox.discard_requests(set(uids))
        with self._lock:
            for uid in uids:
                self._routes.pop(uid, None)
        if self._group.info.size == 1:  # with tp > 1 the failed loop's guard has already stopped the workers
            for uid in uids:
                super()._abort(uid)  # its reply goes nowhere: the route is gone

    def reset_prefix_cache(self) -> int | None:
        """Empty the prefix cache on every rank, from any thread. Pages that running requests read are locked
        and stay. When no loop runs, it happens now and returns the pages rank 0 freed; while the loop runs
        (a step callback, or serve_forever on another thread), it happens before the next step and returns None."""
        self.inbox.post(ResetPrefixCache())
        if self._loop_thread is not None:
            return None
        self._freed_by_reset = 0
        self.run_until_idle()
        return self._freed_by_reset

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any. Further ``generate`` calls then raise WorkerError."""
        engine = getattr(self, "engine", None)  # absent when construction failed part way
        if engine is not None and self._group.info.size > 1:
            engine.release_cuda_graphs()  # they hold NCCL work: gone before the communicators are
        self._group.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _params_per_prompt(prompts: Sequence[Prompt], params: Any) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * len(prompts)
        if isinstance(params, SamplingParams):
            return [params] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise InvalidParamsError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        if not all(isinstance(p, SamplingParams) for p in params):
            raise InvalidParamsError("sampling_params must be SamplingParams or a list of them")
        return params

    def _result(self, uid: int, got: Collected) -> Result:
        if got.finish_reason is None:  # the loop ended without answering: never let it pass silently
            with self._lock:
                self._routes.pop(uid, None)
        return {"uid": uid, **got.result(self.tokenizer)}


def _all_token_ids(prompt: list | tuple) -> bool:
    """Every item an int and none a bool. The types are collected in C first: a per-item isinstance loop cost
    57 ms of nano-vllm's 6 s workload (150,000 prompt ids) before its first step; subclasses of int take the
    slow check."""
    if set(map(type, prompt)) <= {int}:
        return True
    return all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
