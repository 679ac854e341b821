"""Batch-1 decode latency on a CPU: what one person running ``minisgl generate`` feels, token after token.

    .venv/bin/python scripts/cpu_batch1.py [--rounds 5] [--prompt 128] [--tokens 64] [--profile] [--precision fast]

One request of ``--prompt`` random token ids, ``--tokens`` greedy new tokens with EOS ignored. The figure is the
mean gap between consecutive tokens as the request's callback receives them (so the scheduler's host work
per step is inside it), median over ``--rounds`` rounds. The weights' floor (their bytes over the measured
copy bandwidth) is printed next to it. ``--profile`` adds a torch.profiler table of one round's decode steps
(self CPU time per op, with counts per step). ``--stream`` times the engine's own one-row linears alone, every
weight once in a loop (30 layers' four projections and the LM head, on the path the plan chose, and on plain
``torch.mm``, and through the C decode step's GEMV): what streaming the weights costs here, the floor a
decode step could reach. ``--precision fast`` runs the fast engine (on an AVX2 CPU: decode steps in C);
``--precision int8`` the int8 one (on an AVX2 CPU: decode steps in C on int8 copies of the linears and the LM head,
with integer dot products), whose floor counts the int8 values and scales it reads (``--stream`` is for float32
only).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from core import LLM, SamplingParams
from core.bench.floor import Ceilings, copy_gbps, read_gbps
from core.kernels.int8_weights import Int8Weight


class Split:
    """Wall time of decode steps inside the engine's forward pass, the LM head and the sampler, wrapped around
    the engine's own methods (the rest of a token's gap is the scheduler's host work)."""

    def __init__(self, llm: LLM) -> None:
        self.totals = {"forward_batch": 0.0, "lm_head": 0.0, "sample": 0.0}
        self.decoding = False
        engine = llm.engine
        forward_batch = self._timed("forward_batch", engine.forward_batch)

        def forward_and_note(batch, *args):
            self.decoding = not batch.is_prefill
            return forward_batch(batch, *args)

        engine.forward_batch = forward_and_note
        engine.model.lm_head.forward = self._timed("lm_head", engine.model.lm_head.forward)
        engine.sampler.sample = self._timed("sample", engine.sampler.sample)

    def _timed(self, name: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.decoding:
                    self.totals[name] += time.perf_counter() - start
        return wrapper


def one_round(llm: LLM, prompt: list[int], tokens: int) -> float:
    """Mean ms between consecutive tokens of one request."""
    stamps: list[float] = []

    def on_reply(reply) -> None:
        if reply.token is not None:
            stamps.append(time.perf_counter())

    llm.submit(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True), on_reply=on_reply)
    llm.run_until_idle()
    llm.reset_prefix_cache()
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return 1e3 * sum(gaps) / len(gaps) if gaps else 0.0


def stream_ms(llm: LLM, packed: bool, repeats: int = 7) -> float:
    """Median ms of one pass of one-row linears over every weight the decode step reads."""
    layers = [m for m in llm.engine.model.modules() if hasattr(m, "packed")]
    inputs = {m.weight.shape[1]: torch.randn(1, m.weight.shape[1]) for m in layers}

    def one_pass() -> None:
        for m in layers:
            x = inputs[m.weight.shape[1]]
            m.kernels.linear(x, m.weight, None, m.packed) if packed else torch.mm(x, m.weight.t())

    times = []
    with torch.inference_mode():
        one_pass()
        for _ in range(repeats):
            start = time.perf_counter()
            one_pass()
            times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def stream_c_ms(llm: LLM, repeats: int = 7) -> float | None:
    """The same pass through the C decode step's matrix-vector product (None where it does not build)."""
    from core.kernels.cpu_decode import load_library

    lib = load_library().library
    if lib is None:
        return None
    layers = [m for m in llm.engine.model.modules() if hasattr(m, "packed")]
    inputs = {m.weight.shape[1]: torch.randn(m.weight.shape[1]) for m in layers}
    outputs = {m.weight.shape[0]: torch.empty(m.weight.shape[0]) for m in layers}
    threads = torch.get_num_threads()

    def one_pass() -> None:
        for m in layers:
            rows, cols = m.weight.shape
            lib.gemv(m.weight.data_ptr(), inputs[cols].data_ptr(), rows, cols, outputs[rows].data_ptr(), threads)

    one_pass()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        one_pass()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def weight_bytes(llm: LLM) -> int:
    """Bytes of the weights a decode step reads: under int8 in C, the step's int8 values and scales (decoder
    linears and LM head; the norms are a few KB); else the parameters (a quantised linear's float32 one is
    freed), plus the int8 values and scales of the quantised linears."""
    step = llm.engine.cpu_decode
    if step is not None and isinstance(step.lm_head, Int8Weight):
        weights = [step.lm_head] + [getattr(layer, name) for layer in step.layers_kept
                                    for name in ("qkv", "o_proj", "gate_up", "down")]
        return sum(t.numel() * t.element_size() for w in weights for t in (w.values, w.scales))
    total = sum(p.numel() * p.element_size() for p in llm.engine.model.parameters())
    for module in llm.engine.model.modules():
        if isinstance(getattr(module, "packed", None), Int8Weight):
            total += sum(t.numel() * t.element_size() for t in (module.packed.values, module.packed.scales))
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--precision", default="exact", choices=("exact", "fast", "int8"),
                        help="fast: single-request decode steps in C where the CPU has AVX2 and FMA; int8: the "
                             "same on int8 decoder weights")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    llm = LLM(device="cpu", precision=args.precision)
    print(f"engine built in {time.perf_counter() - start:.1f} s; {llm.engine.describe()}")
    if llm.precision_note:
        print(llm.precision_note)
    rng = random.Random(0)
    prompt = [rng.randrange(10000) for _ in range(args.prompt)]
    one_round(llm, prompt, 8)  # warm-up
    times = [one_round(llm, prompt, args.tokens) for _ in range(args.rounds)]
    read = weight_bytes(llm)
    cpu = torch.device("cpu")
    bandwidth = Ceilings(copy_gbps(cpu), 0.0, read_gbps(cpu)).stream_gbps  # the bench's floors' rule
    floor_ms = 1e3 * read / (bandwidth * 1e9)
    print(f"batch-1 decode: median {statistics.median(times):.2f} ms/token over {args.rounds} rounds "
          f"({', '.join(f'{t:.1f}' for t in times)}); weights {read / 1e6:.0f} MB at {bandwidth:.1f} GB/s: "
          f"floor {floor_ms:.1f} ms")
    split = Split(llm)
    gap = one_round(llm, prompt, args.tokens)
    per = {k: 1e3 * v / (args.tokens - 1) for k, v in split.totals.items()}
    layers = per["forward_batch"] - per["lm_head"] - per["sample"]
    if llm.engine.cpu_decode is not None:
        print(f"one round of {args.tokens - 1} decode steps, ms per token: gap {gap:.2f} = the C step (embedding, "
              f"layers, final norm and LM head) {layers:.2f} + sampling {per['sample']:.2f} + host work "
              f"{gap - per['forward_batch']:.2f}")
    else:
        print(f"one round of {args.tokens - 1} decode steps, ms per token: gap {gap:.2f} = embedding, layers and "
              f"final norm {layers:.2f} + LM head {per['lm_head']:.2f} + sampling {per['sample']:.2f} + host work "
              f"{gap - per['forward_batch']:.2f}")
    if args.stream and llm.engine.int8_linears == 0:
        print(f"weights alone, one row: {stream_ms(llm, True):.1f} ms on the engine's path "
              f"(one row packed: {llm.engine.plan.kernels.packed_one_row}), "
              f"{stream_ms(llm, False):.1f} ms on torch.mm, "
              f"{stream_c_ms(llm) or float('nan'):.1f} ms on the C decode step's GEMV")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            one_round(llm, prompt, args.tokens)
        print(f"(counts are for {args.tokens} steps: 1 prefill and {args.tokens - 1} decode steps)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60))


if __name__ == "__main__":
    main()
