"""The offline interface: give it prompts, get completions, no server.

LLM is a Scheduler whose IO is in memory: ``generate`` queues the prompts, runs the scheduler's loop until
nothing is left, and collects the replies. Because it is the same loop a server would run, testing the
offline interface tests the scheduling itself.

With ``tp=N > 1`` the LLM is rank 0 of N tensor-parallel ranks: it starts the other N-1 as worker processes,
sends each call's requests to them, and every rank runs this same loop (core/distributed/workers.py).
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from core.config import EngineConfig
from core.distributed.info import tp_scope
from core.distributed.workers import start_group
from core.errors import InvalidParamsError, ModelLoadError, one_line
from core.models.random_spec import ByteTokenizer, RandomSpec
from core.models.weights import resolve_model_dir
from core.request import SamplingParams
from core.scheduler.scheduler import Reply, Scheduler

Prompt = str | list[int]


@dataclass
class _Collected:
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None


def load_tokenizer(model_dir: Path | RandomSpec) -> Any:
    if isinstance(model_dir, RandomSpec):
        return ByteTokenizer()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
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
                 overlap: bool | None = None, kv_dtype: str = "auto",
                 log: Callable[[str], None] | None = None) -> None:
        config = EngineConfig(model=model, cache=cache, page_size=page_size, max_running_req=max_running_req,
                              num_pages=num_pages, kv_cache_gb=kv_cache_gb, max_seq_len=max_seq_len,
                              max_extend_tokens=max_extend_tokens, dtype=dtype, device=device, attention=attention,
                              cuda_graph_max_bs=cuda_graph_max_bs, max_prefill_streak=max_prefill_streak, tp=tp,
                              overlap=overlap, kv_dtype=kv_dtype)
        model_dir = resolve_model_dir(model, log)
        self.model_dir = model_dir
        self.tokenizer = load_tokenizer(model_dir)
        self._group = start_group(config, model_dir)
        weakref.finalize(self, self._group.close)
        with self._group.guard(), tp_scope(self._group.info):
            super().__init__(self._group.config, model_dir, log)
            self._group.wait_ready()
        self._next_uid = 0
        self._collected: dict[int, _Collected] = {}
        self._reply_callbacks: list[Callable[[Reply], None]] = []

    def add_reply_callback(self, fn: Callable[[Reply], None]) -> None:
        """Called for every reply (each new token and each finish): progress bars and streaming use this."""
        self._reply_callbacks.append(fn)

    def tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise InvalidParamsError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def send_result(self, replies: list[Reply]) -> None:
        for reply in replies:
            got = self._collected.get(reply.uid)
            if got is None or got.finish_reason is not None:  # unknown, or already answered (aborted)
                continue
            if reply.token is not None and not (reply.finish_reason == "stop" and reply.token in self.eos_token_ids):
                got.token_ids.append(reply.token)
            if reply.finished:
                got.finish_reason, got.error = reply.finish_reason, reply.error
            for fn in self._reply_callbacks:
                fn(reply)

    def generate(self, prompts: Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[dict[str, Any]]:
        """Complete every prompt; results come back in prompt order, one per prompt, errors included."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise InvalidParamsError("prompts must be a list of strings or of token-id lists")
        params = self._params_per_prompt(prompts, sampling_params)
        prompt_ids = [self.tokenize(p) for p in prompts]
        uids = list(range(self._next_uid, self._next_uid + len(prompts)))
        self._next_uid += len(prompts)
        for uid, ids in zip(uids, prompt_ids):
            self._collected[uid] = _Collected(ids)
        # rank 0 decides every seed, so all tensor-parallel ranks sample alike
        requests = [(uid, ids, sp if sp.seed is not None else dataclasses.replace(sp, seed=self._rng.getrandbits(62)))
                    for uid, ids, sp in zip(uids, prompt_ids, params)]
        try:
            with self._group.guard():
                for uid, ids, sp in self._group.share(requests, self.eos_token_ids):
                    self.submit(uid, ids, sp)
                self.run_until_idle()
        except BaseException:  # Ctrl-C or an error mid-run: free what this call holds, so the LLM stays usable
            self._abandon(uids)
            raise
        return [self._result(uid) for uid in uids]

    def abort(self, uid: int) -> bool:
        """Stop request ``uid`` (from a step or reply callback while ``generate`` runs): its row and pages are
        freed, its result has finish_reason 'abort' with the tokens produced so far, the others go on."""
        if self._group.info.size > 1:
            raise InvalidParamsError("abort is not available with tp > 1")
        return super().abort(uid)

    def _abandon(self, uids: list[int]) -> None:
        for uid in uids:
            got = self._collected.pop(uid, None)
            if got is not None and got.finish_reason is None and self._group.info.size == 1:
                super().abort(uid)

    def reset_prefix_cache(self) -> int:
        """Empty the prefix cache on every rank; returns the pages rank 0 freed."""
        with self._group.guard():
            self._group.reset_prefix_cache()
        return super().reset_prefix_cache()

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

    def _result(self, uid: int) -> dict[str, Any]:
        got = self._collected.pop(uid)
        if got.finish_reason is None:  # the loop ended without answering: never let it pass silently
            got.finish_reason, got.error = "error", "request was not completed"
        text = self.tokenizer.decode(got.token_ids, skip_special_tokens=True)
        return {"uid": uid, "text": text, "token_ids": got.token_ids, "finish_reason": got.finish_reason, "error": got.error,
                "prompt_tokens": len(got.prompt_ids)}
