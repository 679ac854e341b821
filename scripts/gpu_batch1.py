"""Batch-1 decode with and without a switch, engines in alternating fresh processes, tokens compared.

The figure is the peer harness's: one greedy request of 128 prompt ids, (time of 257 tokens - time of 1) / 256,
best of three, so prefill and start-up are left out. Each round runs one process with the switch unset and one
with it set to 1, so the machine's drift falls on both sides; the greedy tokens of the two must be the same when
the switch only changes how a step is computed.

    python3 scripts/gpu_batch1.py --switch MINISGL_DISABLE_SCREENED_HEAD --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def batch1(llm) -> tuple[float, list[int]]:
    """The peer harness's batch-1 figure on a built LLM: ms per decode step, and the 257 greedy tokens."""
    import torch

    from core import SamplingParams

    prompt = [(7 * i + 3) % 10000 for i in range(128)]

    def timed(tokens: int) -> tuple[float, list[int]]:
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = llm.generate([prompt], SamplingParams(max_tokens=tokens, ignore_eos=True))[0]
        torch.cuda.synchronize()
        llm.reset_prefix_cache()
        return time.perf_counter() - start, list(result["token_ids"])

    timed(257)  # warm-up
    one = min(timed(1)[0] for _ in range(3))
    runs = [timed(257) for _ in range(3)]
    return (min(t for t, _ in runs) - one) / 256 * 1e3, runs[0][1]


def measure(model: str) -> dict:
    from core import LLM

    llm = LLM(model, page_size=16, max_running_req=8, max_seq_len=4096)
    ms, tokens = batch1(llm)
    engine = llm.engine.describe()
    llm.close()
    return {"batch1_ms": ms, "tokens": tokens, "engine": engine}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--switch", required=True, help="an environment variable that turns something off")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default="random:qwen3-0.6b")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.model)))
        return
    results: dict[str, list[dict]] = {"on": [], "off": []}
    for _ in range(args.rounds):
        for side in ("on", "off"):
            env = dict(os.environ)
            env.pop(args.switch, None)
            if side == "off":
                env[args.switch] = "1"
            run = subprocess.run([sys.executable, __file__, "--child", "--switch", args.switch, "--model", args.model],
                                 env=env, capture_output=True, text=True)
            if run.returncode:
                sys.exit(f"the {side} run failed:\n{run.stderr[-3000:]}")
            results[side].append(json.loads(run.stdout.strip().splitlines()[-1]))
            print(f"{side:3s} ({args.switch} {'set' if side == 'off' else 'unset'}): "
                  f"{results[side][-1]['batch1_ms']:.3f} ms a token", flush=True)
    same = all(r["tokens"] == results["on"][0]["tokens"] for side in results.values() for r in side)
    on = statistics.median(r["batch1_ms"] for r in results["on"])
    off = statistics.median(r["batch1_ms"] for r in results["off"])
    print(f"median: {on:.3f} ms with it, {off:.3f} without ({off / on:.3f}x); greedy tokens "
          f"{'the same' if same else 'DIFFER'} in every run")
    print(f"engine: {results['on'][0]['engine']}")


if __name__ == "__main__":
    main()
