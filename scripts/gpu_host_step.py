"""Where the host's time goes in a decode step, and whether the device waits for it.

Under overlap scheduling the host prepares and launches step N+1 while the device runs step N, then waits for
step N's tokens. When the host's share of a step (everything but that wait) is longer than the device's step,
the device idles and the host sets the pace: at batch 1 on a fast GPU that can be the case. This wraps the
scheduler's and the engine's step methods with timers on the host, runs one request's decode, and prints each
part's mean microseconds a step (nested parts indented), and the wait for the device.

    python3 scripts/gpu_host_step.py                    # random:qwen3-0.6b on CUDA, batch 1
    python3 scripts/gpu_host_step.py --model random:small-qwen3 --device cpu --tokens 64    # the script itself
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict
from typing import Any, Callable

import torch

from core import LLM, SamplingParams
from core.engine.engine import ForwardOutput


class Timers:
    """Total host seconds and calls per named part; a part is timed by wrapping the callable that does it."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.order: list[tuple[str, int]] = []  # (name, depth) as first wrapped

    def wrap(self, owner: Any, attr: str, name: str, depth: int) -> None:
        inner: Callable = getattr(owner, attr)
        if (name, depth) not in self.order:  # several callables may share a name (each graph's replay)
            self.order.append((name, depth))

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.total[name] += time.perf_counter() - start
                self.calls[name] += 1

        setattr(owner, attr, timed)

    def reset(self) -> None:
        self.total.clear()
        self.calls.clear()


def instrument(llm: LLM, timers: Timers) -> None:
    engine = llm.engine
    timers.wrap(llm, "_receive", "receive (inbox, callbacks)", 0)
    timers.wrap(llm, "_schedule_next_batch", "schedule + prepare", 0)
    timers.wrap(llm, "_prepare", "prepare (pages, indices upload, metadata)", 1)
    timers.wrap(engine.attn_backend, "prepare_metadata", "attention metadata (page lists)", 2)
    timers.wrap(engine.sampler, "prepare", "sampler arguments", 2)
    timers.wrap(llm, "_launch", "launch", 0)
    timers.wrap(engine, "forward_batch", "forward_batch", 1)
    if engine.graph_runner is not None:
        timers.wrap(engine.graph_runner, "run", "graph runner (copies, plan, replay)", 2)
        timers.wrap(engine.attn_backend, "plan_cuda_graph", "plan for the graph (page-list copies)", 3)
        for graph in engine.graph_runner.graphs.values():
            timers.wrap(graph, "replay", "graph replay call", 3)
    timers.wrap(engine.sampler, "sample", "sample", 2)
    timers.wrap(engine, "to_host", "to_host (token copy, event)", 1)
    timers.wrap(llm, "_finish", "finish", 0)
    timers.wrap(ForwardOutput, "wait", "wait for the device", 1)
    timers.wrap(llm, "_process_results", "results (tokens, replies)", 1)
    timers.wrap(llm, "_emit", "step event", 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:qwen3-0.6b")
    parser.add_argument("--device", default=None)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--tokens", type=int, default=256, help="tokens decoded")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    llm = LLM(args.model, page_size=16, max_running_req=8, max_seq_len=4096, device=args.device, log=print)
    vocab = min(10000, llm.engine.model_config.vocab_size)
    prompt = [random.Random(0).randrange(vocab) for _ in range(args.prompt)]
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    llm.generate([prompt], params)  # warm-up
    timers = Timers()
    instrument(llm, timers)
    for round_ in range(args.rounds):
        timers.reset()
        llm.reset_prefix_cache()
        start = time.perf_counter()
        llm.generate([prompt], params)
        wall = time.perf_counter() - start
        steps = timers.calls["launch"]
        if not steps:
            raise SystemExit("no step ran: the request was refused")
        print(f"round {round_ + 1}: {steps} steps, {wall / steps * 1e6:.1f} us a step on the wall clock")
        for name, depth in timers.order:
            if timers.calls[name]:
                print(f"  {'  ' * depth}{timers.total[name] / steps * 1e6:8.1f} us  {name} "
                      f"({timers.calls[name] / steps:.2f} calls a step)")
        busy = sum(timers.total[n] for n, d in timers.order if d == 0) - timers.total["wait for the device"]
        print(f"  host busy {busy / steps * 1e6:.1f} us a step, waiting "
              f"{timers.total['wait for the device'] / steps * 1e6:.1f}")
    llm.close()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
