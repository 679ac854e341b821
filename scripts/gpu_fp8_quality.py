"""How far an fp8 KV cache moves greedy tokens: the nano-vllm workload's prompts through a bf16-KV engine and an
fp8-KV engine (both flashinfer with CUDA graphs, page 16), compared under the near-tie rule of the GPU checks
(core/bench/reference.py): exact when every token agrees, near-tie when at the first differing position each
engine's token is among the other's five most likely, a mismatch otherwise. Also prints where the first
differences fall. Greedy, so that a difference is the cache's and not the sampler's.

    python3 scripts/gpu_fp8_quality.py [--requests 256] [--max-tokens N] [--json out.json]

On a machine without CUDA it runs the torch backend (which stores fp8 too), for a quick look with
``--model random:small-qwen3 --requests 4 --max-tokens 8``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from core import LLM, SamplingParams  # noqa: E402
from core.bench.workload import make_workload, workload_spec  # noqa: E402
from core.bench.reference import near_tie_compare  # noqa: E402

MODEL = "random:qwen3-0.6b"


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=None, help="cap each request's output (default: the "
                        "workload's own, 100-1024)")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    memory = {"kv_cache_gb": 30.0} if torch.cuda.is_available() else {}
    engines = {kv: LLM(args.model, kv_dtype=kv, page_size=16, max_running_req=256, max_seq_len=4096, **memory)
               for kv in ("auto", "fp8")}
    workload = make_workload(workload_spec("nanovllm"), engines["auto"].engine.model_config.vocab_size,
                             num_requests=args.requests)
    prompts = [r.prompt_ids for r in workload.requests]
    params = [SamplingParams(max_tokens=min(r.max_tokens, args.max_tokens or r.max_tokens), ignore_eos=True)
              for r in workload.requests]
    outs = {}
    for kv, llm in engines.items():
        start = time.perf_counter()
        outs[kv] = [r["token_ids"] for r in llm.generate(prompts, params)]
        print(f"{kv} KV: {sum(map(len, outs[kv])):,} tokens in {time.perf_counter() - start:.1f} s", flush=True)
    verdict = near_tie_compare(engines["auto"], engines["fp8"], prompts, outs["auto"], outs["fp8"])
    differences = [first_difference(a, b) for a, b in zip(outs["auto"], outs["fp8"])]
    firsts = [p for p in differences if p is not None]
    tokens = sum(map(len, outs["auto"]))
    agreeing = sum(len(a) if p is None else p for a, p in zip(outs["auto"], differences))
    summary = {"requests": len(prompts), "exact": verdict.exact, "near_tie": verdict.near_tie,
               "mismatch": verdict.mismatch, "tokens": tokens, "tokens_before_first_difference": agreeing,
               "first_difference_median": statistics.median(firsts) if firsts else None,
               "first_difference_min": min(firsts) if firsts else None, "details": verdict.details}
    print(f"fp8 against bf16 KV, {len(prompts)} nano-vllm prompts, greedy: {verdict}; "
          f"{agreeing:,} of {tokens:,} tokens agree before each request's first difference"
          + (f"; first differences at position median {summary['first_difference_median']:.0f}, "
             f"min {summary['first_difference_min']}" if firsts else ""))
    for line in verdict.details[:10]:
        print("  " + line)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    for llm in engines.values():
        llm.close()
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
