"""The engine's interface: submit requests while its loop runs, or complete a list of prompts with generate().

The LLM is a client of the engine (core/llm/engine_core.py) held in this process: ``submit`` (any thread)
tokenizes, posts a request and returns its uid; the loop (``run_until_idle``, or ``serve_forever`` on a thread of
its own) takes it in before its next step, and every reply reaches the request's ``on_reply``. ``generate`` is
submit for each prompt, then the loop until idle: the path a server takes, so testing one tests the other.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from core.config import EngineConfig
from core.engine.engine import Engine
from core.errors import InvalidParamsError, RequestRejected
from core.events import StepCallback
from core.generation import SamplingDefaults, sampling_defaults
from core.llm.arrivals import Arrival, ArrivalFeeder
from core.llm.collect import Collected
from core.llm.engine_core import EngineCore
from core.models.random_spec import RandomSpec
from core.models.tokenizer import load_tokenizer
from core.models.weights import resolve_model_dir
from core.request import Prompt, Result, SamplingParams
from core.llm.routes import ReplyCallback, Routes, tokenize


class LLM:
    """``LLM(model=None | path | 'random:NAME', **options)``: None is the embedded SmolLM2-135M-Instruct; a random
    spec builds a known shape with random weights and reads prompts as token ids or UTF-8 bytes. The options are
    ``EngineConfig``'s (core/config.py); an unknown one is refused with the list of valid ones.

    ``tp=N`` splits the model over N ranks: N-1 worker processes on the CPU (gloo) or N GPUs (NCCL, rank r on GPU
    r), stopped by ``close()`` (or ``with LLM(...) as llm``), garbage collection or interpreter exit. They are
    started with spawn, so a script that uses ``tp > 1`` needs the ``if __name__ == "__main__":`` guard.
    """

    def __init__(self, model: str | None = None, *, log: Callable[[str], None] | None = None,
                 **options: Any) -> None:
        config = EngineConfig.from_options(model=model, **options)
        self.model_dir = resolve_model_dir(model, log)
        self.tokenizer = load_tokenizer(self.model_dir)
        # what a request without SamplingParams gets: the model's generation config, decided once (core/generation.py)
        self.sampling_defaults: SamplingDefaults = sampling_defaults(
            None if isinstance(self.model_dir, RandomSpec) else self.model_dir, config.generation_config,
            config.override_generation_config)
        # the routes post to the engine and read its EOS ids; the engine hands them its replies
        self._routes = Routes(self.tokenizer, lambda message: self.core.post(message),
                              lambda: self.scheduler.eos_token_ids)
        self.core = EngineCore(config, self.model_dir, log, self._routes.deliver)
        self.scheduler = self.core.scheduler

    # ---- what the engine is -------------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        return self.scheduler.engine

    @property
    def config(self) -> EngineConfig:
        return self.scheduler.config

    @property
    def device(self) -> Any:
        return self.scheduler.device

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.scheduler.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: frozenset[int]) -> None:
        """Which tokens end a request (tests set one that occurs often, to stop requests early)."""
        self.scheduler.eos_token_ids = frozenset(ids)

    @property
    def max_seq_len(self) -> int:
        return self.scheduler.max_seq_len

    @property
    def vocab_size(self) -> int:
        return self.scheduler.vocab_size

    @property
    def page_size(self) -> int:
        return self.scheduler.page_size

    @property
    def overlap(self) -> bool:
        return self.scheduler.overlap

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one request can hold: the context, or the whole KV pool if that is smaller."""
        return self.scheduler.limits.capacity_tokens

    def stats(self) -> dict[str, int | float]:
        """Rows and KV pages now, and the prefix cache's hit rate so far (core/scheduler/scheduler.py)."""
        return self.scheduler.stats()

    def rejection(self, input_ids: list[int], params: SamplingParams) -> RequestRejected | None:
        """Why this request can never run here (ContextLengthError when it is too long), or None."""
        return self.scheduler.rejection(input_ids, params)

    # ---- watching the loop --------------------------------------------------------------------------------
    def add_step_callback(self, fn: StepCallback) -> None:
        """``fn(event)`` after every step, on the loop's thread (core/events.py)."""
        self.scheduler.add_step_callback(fn)

    def add_before_step_callback(self, fn: Callable[[int], None]) -> None:
        self.scheduler.add_before_step_callback(fn)

    @property
    def report_radix(self) -> bool:
        """Whether step events carry the radix tree (watchers that draw it turn this on)."""
        return self.scheduler.report_radix

    @report_radix.setter
    def report_radix(self, on: bool) -> None:
        self.scheduler.report_radix = on

    # ---- requests in: any thread -------------------------------------------------------------------------
    def submit(self, prompt: Prompt, sampling_params: SamplingParams | None = None, *,
               on_reply: ReplyCallback | None = None, text: bool = False) -> int:
        """Queue one request and return its uid, from any thread, also while the loop runs (it takes the request in
        before its next step). ``on_reply`` gets every token, then exactly one final reply (finish_reason 'stop',
        'length', 'abort' or 'error' with its message), on the loop's thread. With ``text=True`` (implied by stop
        strings) every reply also carries the text it adds (``Reply.text``), detokenized incrementally, the pieces
        joining to the whole text; a stop string ends the request with 'stop', its text cut before the stop string
        (``Reply.stop_string`` says which). A prompt that can never run here (too long, a token outside the
        vocabulary) is answered with an 'error' reply; ``rejection()`` tells that before submitting."""
        params = sampling_params if sampling_params is not None else self.sampling_defaults.params()
        if not isinstance(params, SamplingParams):
            raise InvalidParamsError("sampling_params must be SamplingParams")
        return self._routes.add(self.tokenize(prompt), params, on_reply, text)

    def abort(self, uid: int) -> bool:
        """Stop request ``uid``, from any thread. True if it was still unanswered: its final reply (finish_reason
        'abort', with the tokens produced so far) is delivered now, and its row and pages are freed before the
        next step. False for an unknown or already finished request."""
        return self._routes.abort(uid)

    def add_reply_callback(self, fn: ReplyCallback) -> None:
        """Called for every reply of every request (each new token and each finish), after the request's own
        ``on_reply``: progress bars use this."""
        self._routes.callbacks.append(fn)

    def tokenize(self, prompt: Prompt) -> list[int]:
        return tokenize(self.tokenizer, prompt)

    @property
    def precision_note(self) -> str:
        """What ``precision='fast'`` (or 'int8') came to on this machine, in one line; empty for 'exact'."""
        return self.engine.precision_note

    @property
    def unanswered(self) -> int:
        """Requests submitted and not yet answered with their final reply."""
        return self._routes.unanswered

    # ---- the loop ----------------------------------------------------------------------------------------
    def run_until_idle(self) -> None:
        """Run the loop on this thread until nothing is queued, running or posted."""
        self.core.run_until_idle()

    def serve_forever(self) -> None:
        """Run the loop on this thread, waiting for requests when there are none, until ``stop()``; then it
        finishes every request already submitted and returns."""
        self.core.serve_forever()

    def stop(self) -> None:
        """Have ``serve_forever`` return once every submitted request is answered. Safe from any thread."""
        self.core.stop()

    @property
    def loop_running_elsewhere(self) -> bool:
        return self.core.loop_running_elsewhere

    # ---- offline: a list of prompts ----------------------------------------------------------------------
    def generate(self, prompts: Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 arrivals: Sequence[Arrival | None] | None = None) -> list[Result]:
        """Complete every prompt; results come back in prompt order, one per prompt, errors included.
        ``arrivals`` (one per prompt, None for "at the start") lets requests enter while the others run: before a
        given step, or some seconds after the start. If ``serve_forever`` runs on another thread, the requests
        join its loop and this waits for them; otherwise this thread runs the loop."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise InvalidParamsError("prompts must be a list of strings or of token-id lists")
        params = params_per_prompt(prompts, sampling_params if sampling_params is not None
                                   else self.sampling_defaults.params())
        if arrivals is not None and len(arrivals) != len(prompts):
            raise InvalidParamsError(f"got {len(arrivals)} arrivals for {len(prompts)} prompts")
        prompt_ids = [self.tokenize(p) for p in prompts]  # every prompt checked before any is queued
        collected = [Collected(len(ids)) for ids in prompt_ids]
        uids: list[int | None] = [None] * len(prompts)

        def submit(indices: list[int]) -> None:
            for i in indices:
                uids[i] = self._routes.add(prompt_ids[i], params[i], collected[i].on_reply)

        try:
            if arrivals is None or self.loop_running_elsewhere:
                submit(list(range(len(prompts))))  # a loop of its own: arrivals are its clients' business
                if self.loop_running_elsewhere:
                    for got in collected:
                        got.done.wait()
                else:
                    self.run_until_idle()
            else:
                self._run_arrivals(ArrivalFeeder(arrivals, self.scheduler.steps_scheduled), submit)
        except BaseException:  # Ctrl-C or an error mid-run: free what this call holds, so the LLM stays usable
            self._abandon([uid for uid in uids if uid is not None])
            raise
        return [self._result(uid, got) for uid, got in zip(uids, collected)]

    def _run_arrivals(self, feeder: ArrivalFeeder, submit: Callable[[list[int]], None]) -> None:
        def at_step(step: int) -> None:
            submit(feeder.due(step))

        submit(feeder.due(self.scheduler.steps_scheduled))
        self.scheduler.add_before_step_callback(at_step)
        try:
            while True:
                self.run_until_idle()
                if feeder.done:
                    return
                submit(feeder.next_when_idle())  # the engine ran out of work before the next arrival
        finally:
            self.scheduler.before_step_callbacks.remove(at_step)

    def _abandon(self, uids: list[int]) -> None:
        if self.loop_running_elsewhere:  # that loop frees them
            for uid in uids:
                self.abort(uid)
            return
        self._routes.forget(uids)  # their replies go nowhere now
        self.core.forget(uids)

    def reset_prefix_cache(self) -> int | None:
        """Empty the prefix cache on every rank, from any thread. Pages that running requests read are locked
        and stay. When no loop runs, it happens now and returns the pages rank 0 freed; while the loop runs
        (a step callback, or serve_forever on another thread), it happens before the next step and returns None."""
        return self.core.reset_prefix_cache()

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any. Further ``generate`` calls then raise WorkerError."""
        self.core.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _result(self, uid: int, got: Collected) -> Result:
        if got.finish_reason is None:  # the loop ended without answering: never let it pass silently
            self._routes.forget([uid])
        return {"uid": uid, **got.result(self.tokenizer)}


def params_per_prompt(prompts: Sequence[Prompt], params: Any) -> list[SamplingParams]:
    """One SamplingParams per prompt: one for all, or a list as long as the prompts."""
    if isinstance(params, SamplingParams):
        return [params] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        raise InvalidParamsError(f"got {len(params)} sampling params for {len(prompts)} prompts")
    if not all(isinstance(p, SamplingParams) for p in params):
        raise InvalidParamsError("sampling_params must be SamplingParams or a list of them")
    return params
