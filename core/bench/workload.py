"""The benchmark workloads: random prompts of random lengths, reproducible from a seed.

Prompt token ids are drawn uniformly, so the text is noise; with EOS ignored every request generates exactly
``max_tokens`` tokens, which makes the work fixed and throughput comparable across engines.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from core.errors import InvalidParamsError


@dataclass(frozen=True)
class WorkloadSpec:
    """The shape of a workload; ``make_workload`` turns it into concrete requests."""

    name: str
    num_requests: int
    prompt_len: tuple[int, int]  # inclusive range
    max_tokens: tuple[int, int]  # inclusive range
    token_id_limit: int  # prompt ids are uniform in [0, min(limit, vocab - 1)], both ends included
    temperature: float
    batch1_tokens: int = 128  # tokens the batch-1 decode request generates (see engine_run.run_batch1)


WORKLOADS = {
    # small enough for two CPU cores: the embedded SmolLM2-135M in float32, greedy
    "cpu": WorkloadSpec("cpu", 32, (16, 128), (16, 64), 10000, 0.0, batch1_tokens=32),
    # the workload nano-vllm and mini-sglang publish, for a GPU
    "nanovllm": WorkloadSpec("nanovllm", 256, (100, 1024), (100, 1024), 10000, 0.6),
}


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: list[int]
    max_tokens: int


@dataclass(frozen=True)
class Workload:
    spec: WorkloadSpec
    requests: list[BenchRequest]
    seed: int

    @property
    def output_tokens(self) -> int:
        """Tokens every engine must generate: the sum of max_tokens (EOS is ignored)."""
        return sum(r.max_tokens for r in self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r.prompt_ids) for r in self.requests)


def workload_spec(name: str) -> WorkloadSpec:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise InvalidParamsError(f"unknown workload {name!r}; use one of {', '.join(WORKLOADS)}") from None


def make_workload(spec: WorkloadSpec, vocab_size: int, seed: int = 0, num_requests: int | None = None,
                  max_seq_len: int | None = None) -> Workload:
    """Draw the requests. ``max_seq_len`` caps prompt + output for models with a short context."""
    count = spec.num_requests if num_requests is None else num_requests
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidParamsError(f"requests must be an integer >= 1, got {count!r}")
    # nano-vllm's own order of draws (every prompt, its length then its ids, then every max_tokens), so that the
    # "nanovllm" workload is exactly the one it and mini-sglang publish: 133,966 output tokens for seed 0
    rng = random.Random(seed)
    high = min(spec.token_id_limit, vocab_size - 1)  # inclusive, as nano-vllm's randint(0, 10000)
    prompts = [[rng.randint(0, high) for _ in range(rng.randint(*spec.prompt_len))] for _ in range(count)]
    budgets = [rng.randint(*spec.max_tokens) for _ in range(count)]
    requests = []
    for prompt, max_tokens in zip(prompts, budgets):
        if max_seq_len is not None and len(prompt) + max_tokens > max_seq_len:
            prompt = prompt[:max(1, min(len(prompt), max_seq_len // 2))]
            max_tokens = max(1, min(max_tokens, max_seq_len - len(prompt)))
        requests.append(BenchRequest(prompt, max_tokens))
    return Workload(spec, requests, seed)


def redraw_ids(workload: Workload, vocab_size: int, salt: int) -> Workload:
    """The same requests (every prompt length and max_tokens kept) with fresh prompt ids drawn from ``salt``.

    A server's prefix cache would find a prompt it has seen before and skip its prefill; a benchmark that sends
    the same shapes several times (a warm-up, then once per rate) sends each time new ids, so every run does the
    same work from a cold cache.
    """
    rng = random.Random(workload.seed * 1_000_003 + salt)
    high = min(workload.spec.token_id_limit, vocab_size - 1)
    requests = [BenchRequest([rng.randint(0, high) for _ in r.prompt_ids], r.max_tokens) for r in workload.requests]
    return Workload(workload.spec, requests, workload.seed)
