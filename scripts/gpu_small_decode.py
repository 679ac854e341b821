"""The small-batch decode's launch shape, timed where it runs: the engine's batch-1 greedy graph, re-captured for
each choice of the grid's splits, tile of cached tokens (a request uses one split per tile) and warp count, in
one process and in alternating rounds so the machine's drift falls on every choice alike.

For each choice: the graph's replay time at each context (one request of that many tokens, the graph replayed
alone, medians), and the peer harness's batch-1 figure (one greedy request of 128 prompt ids, (time of 257
tokens - time of 1) / 256, best of three) with its tokens compared to the first choice's.

    . scripts/gpu_env.sh && python3 scripts/gpu_small_decode.py --rounds 2
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics

import torch

import core.kernels.small_decode as small
from core import LLM, SamplingParams
from gpu_batch1 import batch1  # scripts/, on the path when run as a script

# (the grid's splits per (request, KV head), cached tokens a tile, warps)
CHOICES = [(8, 128, 8), (4, 128, 8), (16, 128, 8), (8, 64, 8), (16, 64, 4), (8, 128, 4), (16, 32, 4)]


def recapture(llm: LLM, choice: tuple[int, int, int]) -> None:
    small.GRID_SPLITS, small.BLOCK_T, small.NUM_WARPS = choice
    engine = llm.engine
    engine.graph_runner = None
    gc.collect()
    torch.cuda.synchronize()
    engine.graph_runner = engine._make_graph_runner(None)


def replay_us(llm: LLM, context: int) -> float:
    """The greedy batch-1 graph replayed alone after a request of ``context`` tokens planned its page lists."""
    prompt = [(11 * i + 5) % 10000 for i in range(context)]
    llm.generate([prompt], SamplingParams(max_tokens=2, ignore_eos=True))
    graph = llm.engine.graph_runner.graphs[1, True]
    times = []
    with torch.cuda.stream(llm.engine.stream):
        for _ in range(15):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 100)  # ms for 10 -> us each
    llm.reset_prefix_cache()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--contexts", default="256,1000,2500")
    parser.add_argument("--choices", default="", help="indices into CHOICES, comma-separated (default all)")
    args = parser.parse_args()
    choices = [CHOICES[int(i)] for i in args.choices.split(",")] if args.choices else CHOICES
    contexts = [int(c) for c in args.contexts.split(",")]
    llm = LLM("random:qwen3-0.6b", page_size=16, max_running_req=8, max_seq_len=4096)
    reference: list[int] | None = None
    for round_no in range(args.rounds):
        for choice in choices:
            recapture(llm, choice)
            replays = {c: round(replay_us(llm, c), 1) for c in contexts}
            ms, tokens = batch1(llm)
            reference = reference or tokens
            same = sum(a == b for a, b in zip(tokens, reference))
            print(json.dumps({"round": round_no, "splits": choice[0], "block_t": choice[1], "warps": choice[2],
                              "replay_us": replays,
                              "batch1_ms": round(ms, 4), "tokens_same": f"{same}/{len(reference)}"}), flush=True)
    llm.close()


if __name__ == "__main__":
    main()
