"""Where the host's time goes in a decode step, and whether the device waits for it.

Under overlap scheduling the host prepares and launches step N+1 while the device runs step N, then waits for
step N's tokens. When the host's share of a step (everything but that wait) is longer than the device's step,
the device idles and the host sets the pace: at batch 1 on a fast GPU that can be the case. This wraps the
scheduler's and the engine's step methods with timers on the host, runs one request's decode, and prints each
part's mean microseconds a step (nested parts indented), and the wait for the device.

    python3 scripts/gpu_host_step.py                    # random:qwen3-0.6b on CUDA, batch 1
    python3 scripts/gpu_host_step.py --model random:small-qwen3 --device cpu --tokens 64    # the script itself

``--batch N`` runs N such requests at once; with a tiny model on the CPU (``--model random:tiny-qwen3 --device cpu
--batch 256 --prompt 32 --tokens 300 --temperature 0.6``) the forward pass is short and the scheduler's own parts,
the same code as on a GPU, are what the table shows.

``--workload`` runs nano-vllm's whole workload instead (256 requests, after one whole run of it to warm up):
the same parts per step, averaged over every step of the run. ``--cprofile N`` then also runs it once under
cProfile and prints the N functions with the most host time of their own (cProfile slows the host, so those
shares, not their seconds, are what it tells). ``--first N`` prints each round's first N timed calls in order,
each with its start after the ``generate`` call and its length: where the run's first step goes (on an H200 the
workload's first prefill step took about 50 ms against 15 for the next ones, docs/BENCHMARKS.md session 40).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections import defaultdict
from typing import Any, Callable

import torch

from core import LLM, SamplingParams
from core.engine.engine import ForwardOutput
from gpu_timeline import decode_kind  # beside this script: Python puts a script's folder on its path


class Timers:
    """Total host seconds and calls per named part; a part is timed by wrapping the callable that does it."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.order: list[tuple[str, int]] = []  # (name, depth) as first wrapped
        self.kind = "start"  # the kind of the step launched last (``step_kind``)
        self.kind_total: dict[tuple[str, str], float] = defaultdict(float)
        self.kind_steps: dict[str, int] = defaultdict(int)
        self.started = 0.0  # when the round's generate was called
        self.first: list[tuple[str, int, float, float]] = []  # (name, depth, start, seconds) of the first calls
        self.keep_first = 0

    def wrap(self, owner: Any, attr: str, name: str, depth: int) -> None:
        inner: Callable = getattr(owner, attr)
        if (name, depth) not in self.order:  # several callables may share a name (each graph's replay)
            self.order.append((name, depth))

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                if len(self.first) < self.keep_first:
                    self.first.append((name, depth, start - self.started, elapsed))
                self.total[name] += elapsed
                self.calls[name] += 1
                self.kind_total[(self.kind, name)] += elapsed

        setattr(owner, attr, timed)

    def reset(self) -> None:
        self.first.clear()
        self.total.clear()
        self.calls.clear()
        self.kind_total.clear()
        self.kind_steps.clear()

    def print_by_kind(self) -> None:
        """Each top-level part's mean host time a step, per kind of step (a part is counted with the step
        launched last: a step's results are handled after the next one is launched)."""
        names = [n for n, depth in self.order if depth == 0] + ["wait for the device"]
        print("  by kind of step (us a step): " + ", ".join(names))
        for kind, steps in self.kind_steps.items():
            parts = ", ".join(f"{self.kind_total[(kind, n)] / steps * 1e6:.0f}" for n in names)
            print(f"    {kind}: {steps} steps: {parts}")

    def print_first(self) -> None:
        """The first timed calls in the order they ended (nested parts end before their callers)."""
        if self.first:
            print("  first calls (ms after generate was called: start, length):")
        for name, depth, start, seconds in self.first:
            print(f"    {'  ' * depth}{start * 1e3:8.2f} {seconds * 1e3:7.2f}  {name}")


class GcTimer:
    """Host time spent in Python's cyclic garbage collector, per generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = defaultdict(float)
        self.count: dict[int, int] = defaultdict(int)
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._start
            self.count[info["generation"]] += 1

    def line(self) -> str:
        parts = [f"gen {g}: {self.count[g]} in {self.seconds[g] * 1e3:.1f} ms" for g in sorted(self.count)]
        return "  garbage collection: " + (", ".join(parts) if parts else "none")

    def reset(self) -> None:
        self.seconds.clear()
        self.count.clear()


def step_kind(batch: Any) -> str:
    """The batch's kind, grouped as scripts/gpu_timeline.py's budget groups steps."""
    return "prefill" if batch.is_prefill else decode_kind(len(batch.reqs))


def mark_kinds(llm: LLM, timers: Timers) -> None:
    """Tell the timers the kind of each step as it is launched."""
    inner = llm.scheduler._launch

    def launch(prepared):
        timers.kind = step_kind(prepared.batch)
        timers.kind_steps[timers.kind] += 1
        return inner(prepared)

    llm.scheduler._launch = launch


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
    if engine.prefill_graph is not None:
        timers.wrap(engine.prefill_graph, "run", "prefill graph (copies, plan, replay)", 2)
    timers.wrap(engine.attn_backend, "begin_forward", "plan (eager step)", 2)
    timers.wrap(engine.sampler, "sample", "sample", 2)
    timers.wrap(engine, "to_host", "to_host (token copy, event)", 1)
    timers.wrap(llm, "_finish", "finish", 0)
    timers.wrap(ForwardOutput, "wait", "wait for the device", 1)
    timers.wrap(llm, "_process_results", "results (tokens, replies)", 1)
    timers.wrap(llm, "_emit", "step event", 1)
    mark_kinds(llm, timers)


def requests(llm: LLM, args: argparse.Namespace) -> tuple[list, Any]:
    """The prompts and sampling parameters of the timed runs: one request, or nano-vllm's workload."""
    if args.workload:
        from core.bench.engine_run import sampling_params
        from core.bench.workload import make_workload, workload_spec

        work = make_workload(workload_spec("nanovllm"), llm.engine.model_config.vocab_size, 0, None, 4096)
        return [r.prompt_ids for r in work.requests], sampling_params(work)
    vocab = min(10000, llm.engine.model_config.vocab_size)
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt)] for _ in range(args.batch)]
    return prompts, SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=args.temperature)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:qwen3-0.6b")
    parser.add_argument("--device", default=None)
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--tokens", type=int, default=256, help="tokens decoded")
    parser.add_argument("--batch", type=int, default=1, help="requests run at once (each --prompt, --tokens)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--page-size", type=int, default=128, help="tokens a KV page (the peer harness's)")
    parser.add_argument("--workload", action="store_true", help="nano-vllm's workload instead of one request")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="with --workload: one more run under cProfile, its N largest own times")
    parser.add_argument("--first", type=int, default=0, metavar="N",
                        help="print each round's first N timed calls, when each started and how long it took")
    args = parser.parse_args()
    running = 256 if args.workload else max(args.batch, 8)
    llm = LLM(args.model, page_size=args.page_size, max_running_req=running, max_seq_len=4096, device=args.device,
              log=print)
    prompts, params = requests(llm, args)
    llm.generate(prompts, params)  # warm-up
    timers = Timers()
    timers.keep_first = args.first
    instrument(llm, timers)
    collections = GcTimer()
    for round_ in range(args.rounds):
        llm.reset_prefix_cache()  # a loop of its own: before the timers start
        timers.reset()
        collections.reset()
        start = timers.started = time.perf_counter()
        llm.generate(prompts, params)
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
        timers.print_by_kind()
        timers.print_first()
        print(collections.line())
    if args.cprofile:
        import cProfile
        import pstats

        llm.reset_prefix_cache()
        profiler = cProfile.Profile()
        profiler.runcall(llm.generate, prompts, params)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.cprofile)
    llm.close()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
