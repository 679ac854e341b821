"""How long a running stream stalls when a request under a new grammar arrives: one free request streams on the
serving loop, and after its 30th token a constrained one is submitted; the figures are the gaps between the free
stream's tokens from then on (the longest, the median, and the time the gaps over three medians lost), and how long
the constrained request took to its first token and to its last.

By default the constrained request is the engine's first, so its tokenizer tables are built too; ``--compile-only``
builds them beforehand with another grammar and measures a large schema's compile alone. On the embedded model:

    python3 scripts/grammar_stall_bench.py
    python3 scripts/grammar_stall_bench.py --compile-only
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from core import LLM, SamplingParams
from core.constraint import Constraint

SMALL = Constraint.json_schema({"type": "object", "required": ["name", "age"],
                                "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}})
ITEM = {"type": "object", "required": ["a", "b"], "properties": {
    "a": {"type": "string", "pattern": "[a-z]{3,9}"}, "b": {"enum": ["x", "y", "z"]}, "n": {"type": "integer"}}}
LARGE = Constraint.json_schema({"type": "object", "required": [f"f{i}" for i in range(200)],
                                "properties": {f"f{i}": {"type": "array", "items": ITEM} for i in range(200)}})
BEFORE = 30  # free tokens before the constrained request arrives


def stream_gaps(llm: LLM, constraint: Constraint) -> tuple[list[float], list[float]]:
    """The gaps between the free stream's tokens after the constrained request was submitted, and the constrained
    request's times from its submission to its first token and to its last."""
    stamps: list[float] = []
    constrained: list[float] = []
    finished = threading.Semaphore(0)

    def on_free(reply) -> None:
        if reply.token is not None:
            stamps.append(time.perf_counter())
        if reply.finished:
            finished.release()

    loop = threading.Thread(target=llm.serve_forever, daemon=True)
    loop.start()
    while not llm.loop_running_elsewhere:
        time.sleep(0.001)
    llm.submit("Tell me a long story about a cat.", SamplingParams(max_tokens=120, ignore_eos=True), on_reply=on_free)
    while len(stamps) < BEFORE:
        time.sleep(0.001)
    def on_constrained(reply) -> None:
        if reply.token is not None or reply.finished:
            constrained.append(time.perf_counter() - submitted)
        if reply.finished:
            finished.release()

    submitted = time.perf_counter()
    llm.submit("A person as JSON:", SamplingParams(max_tokens=40, constraint=constraint), on_reply=on_constrained)
    finished.acquire()
    finished.acquire()
    llm.stop()
    loop.join()
    return [b - a for a, b in zip(stamps[BEFORE - 1:], stamps[BEFORE:])], [constrained[0], constrained[-1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model directory (default: the embedded model)")
    parser.add_argument("--compile-only", action="store_true", help="tables built first; a large schema arrives")
    args = parser.parse_args()
    llm = LLM(args.model)
    warm = Constraint.regex("[a-z]+") if args.compile_only else None
    llm.generate(["warm up"], SamplingParams(max_tokens=4, constraint=warm))
    gaps, (first, last) = stream_gaps(llm, LARGE if args.compile_only else SMALL)
    median = statistics.median(gaps)
    lost = sum(g - median for g in gaps if g > 3 * median)
    print(f"longest gap {max(gaps) * 1000:.0f} ms, median {median * 1000:.1f} ms, "
          f"lost in gaps over 3 medians {lost * 1000:.0f} ms; "
          f"the constrained request's first token {first * 1000:.0f} ms, last {last * 1000:.0f} ms")


if __name__ == "__main__":
    main()
