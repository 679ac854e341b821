"""Which GPU features hold up under tensor parallelism: tp=2 with CUDA graphs and overlap scheduling on and off.

    python scripts/gpu_tp_probe.py            # on a machine with two GPUs, after . scripts/gpu_env.sh

Each configuration runs in its own process with a time limit, so one that hangs is reported (with rank 0's
stack, from faulthandler) and the next still runs. Each generates the same greedy batch as a tp=1 engine run
first and counts the prompts whose tokens agree exactly; bf16 sums in a different order on two GPUs, so a few
near-tie flips are expected. Prints one line per configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

CASE = r"""
import faulthandler, json, random, time
faulthandler.dump_traceback_later({hang_s}, exit=True)
from core import LLM, SamplingParams
if __name__ == "__main__":
    rng = random.Random(0)
    prompts = [[rng.randrange(10000) for _ in range(rng.randint(20, 300))] for _ in range({prompts})]
    params = SamplingParams(max_tokens={tokens}, ignore_eos=True)
    start = time.time()
    llm = LLM("random:qwen3-0.6b", tp={tp}, max_running_req=64, kv_cache_gb=8.0, max_seq_len=1024,
              cuda_graph_max_bs={graphs})
    loaded = time.time() - start
    llm.generate(prompts[:2], SamplingParams(max_tokens=4, ignore_eos=True))
    start = time.time()
    out = [r["token_ids"] for r in llm.generate(prompts, params)]
    wall = time.time() - start
    llm.close()
    print("RESULT " + json.dumps(dict(tokens=out, load_s=loaded, wall_s=wall)), flush=True)
"""


def run_case(tp: int, graphs: int, overlap: bool, prompts: int, tokens: int, limit_s: int) -> dict:
    env = dict(os.environ)
    if not overlap:
        env["MINISGL_DISABLE_OVERLAP_SCHEDULING"] = "1"
    code = CASE.format(hang_s=limit_s - 10, prompts=prompts, tokens=tokens, tp=tp, graphs=graphs)
    start = time.time()
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired as exc:
        return {"status": "timeout", "seconds": time.time() - start, "log": (exc.stderr or b"")[-3000:]}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return {"status": "ok", "seconds": time.time() - start, **json.loads(line[7:])}
    return {"status": f"exit {done.returncode}", "seconds": time.time() - start, "log": done.stderr[-3000:]}


def main() -> int:
    prompts, tokens, limit = 32, 48, 100
    base = run_case(1, 64, True, prompts, tokens, limit)
    print(f"tp=1 graphs overlap: {base['status']} in {base['seconds']:.0f}s", flush=True)
    ok = True
    for graphs, overlap in ((64, True), (0, True), (64, False), (0, False)):
        got = run_case(2, graphs, overlap, prompts, tokens, limit)
        name = f"tp=2 graphs={'on' if graphs else 'off'} overlap={'on' if overlap else 'off'}"
        if got["status"] != "ok":
            ok = False
            print(f"{name}: {got['status']} after {got['seconds']:.0f}s\n{got.get('log', '')}", flush=True)
            continue
        same = sum(a == b for a, b in zip(got["tokens"], base.get("tokens", [])))
        print(f"{name}: ok, load {got['load_s']:.0f}s, generate {got['wall_s']:.2f}s "
              f"({prompts * tokens / got['wall_s']:,.0f} tok/s), {same}/{prompts} prompts exactly as tp=1",
              flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
