"""The host's work per decode step under a grammar, piece by piece, with no model: advancing the matchers with the
sampled tokens (one by one, as the engine does, or llguidance's consume_token_par on pools of several sizes) and
filling their token masks (on pools of several sizes).

The matchers are structured_bench.py's: the JSON schema over a random model's byte tokenizer (ids below 256 are
bytes, the rest special tokens) of a 151,936-token vocabulary, as random:qwen3-0.6b has. One walk draws each step's
tokens among those the masks allow (a finished request starts again), and every method replays it on matchers of
its own; each figure is the median step. On the machine that runs the GPU benchmarks:

    python3 scripts/grammar_host_bench.py --rows 256
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any, Callable

import torch
from llguidance import LLExecutor, LLMatcher

from core.constrain.grammars import Grammars
from core.constrain.masks import advance
from core.constraint import Constraint
from structured_bench import SCHEMA


def allowed_bytes(bits: torch.Tensor) -> list[list[int]]:
    """Per row of bitmasks, the byte tokens (ids below 256) it allows."""
    low = bits[:, :8].contiguous().view(torch.uint8)
    unpacked = (low[:, :, None] >> torch.arange(8, dtype=torch.uint8)) & 1
    return [row.nonzero().view(-1).tolist() for row in unpacked.view(len(bits), 256)]


def walk(start: Any, rows: int, steps: int, vocab: int, fill: Callable[[list[Any]], torch.Tensor]) -> list[list[int]]:
    """Each step's sampled tokens: a byte the mask allows (EOS where none is), drawn at random."""
    rng, matchers, out = random.Random(0), [start.deep_copy() for _ in range(rows)], []
    for _ in range(steps):
        tokens = [rng.choice(allowed) if allowed else vocab - 1 for allowed in allowed_bytes(fill(matchers))]
        out.append(tokens)
        matchers = [start.deep_copy() if advance(m, t) else m for m, t in zip(matchers, tokens)]
    return out


def replay(start: Any, walked: list[list[int]], timed: Callable[[list[Any], list[int]], list[bool] | None]) -> float:
    """The median time of ``timed`` over the walk, on matchers of its own, in milliseconds (where it does not
    advance them, returning None, they are advanced one by one after it)."""
    matchers, times = [start.deep_copy() for _ in walked[0]], []
    for tokens in walked:
        began = time.perf_counter()
        done = timed(matchers, tokens)
        times.append(time.perf_counter() - began)
        done = done if done is not None else [advance(m, t) for m, t in zip(matchers, tokens)]
        matchers = [start.deep_copy() if d else m for m, d in zip(matchers, done)]
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--vocab", type=int, default=151936)
    args = parser.parse_args()
    grammars = Grammars(lambda: None, args.vocab, lambda: [args.vocab - 1])
    start = grammars.matcher(Constraint.json_schema(SCHEMA))
    words = (args.vocab + 31) // 32
    bits = torch.empty((args.rows, words), dtype=torch.int32)

    def filler(pool: Any) -> Callable[[list[Any]], torch.Tensor]:
        def fill(matchers: list[Any]) -> torch.Tensor:
            pool.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bits.data_ptr(), words * 4,
                                         len(matchers))
            return bits
        return fill

    walked = walk(start, args.rows, args.steps, args.vocab, filler(LLExecutor()))
    pools = sorted({1, 2, 4, 8, max(1, (os.cpu_count() or 1) * 4 // 5)})
    print(f"{args.rows} matchers, a {args.vocab:,}-token vocabulary, {os.cpu_count()} CPUs; median step, ms")
    print(f"advance one by one: {replay(start, walked, lambda ms, ts: [advance(m, t) for m, t in zip(ms, ts)]):.3f}")
    for threads in pools:
        pool = LLExecutor(threads)
        fill = filler(pool)

        def par(ms: list[Any], ts: list[int]) -> list[bool]:
            taken = pool.consume_token_par(list(zip(ms, ts)))
            return [not ok or m.is_stopped() for ok, m in zip(taken, ms)]

        def fill_only(ms: list[Any], ts: list[int]) -> None:
            fill(ms)

        print(f"{threads:2d} threads: consume_token_par {replay(start, walked, par):.3f}, "
              f"mask fill {replay(start, walked, fill_only):.3f}")


if __name__ == "__main__":
    main()
