"""Online serving against offline generation, on one engine in one run.

    .venv/bin/python scripts/bench_serve.py --model random:qwen3-0.6b --requests 256 --rate 32

1. offline: ``LLM.generate`` on the whole workload at once (the throughput ceiling);
2. online: the same engine behind ``minisgl serve``'s app (uvicorn on 127.0.0.1), the same requests sent as
   streaming completions at ``--rate`` requests per second (Poisson arrivals, seeded), each timed from its
   send: time to first token (TTFT), time per output token after it (TPOT), and the run's throughput.

The workload is drawn as ``minisgl bench`` draws its own (core/bench/workload.py): random prompt ids, prompt
length and max_tokens uniform in the given ranges, greedy, ignore_eos, so every request generates exactly its
max_tokens; percentiles follow the bench's one rule (core/bench/report.py). Throughput is output tokens over
wall time; online it can be no higher than the rate times the mean max_tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import threading
import time

from core import LLM, SamplingParams
from core.bench.report import Percentiles
from core.bench.workload import WorkloadSpec, make_workload


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second (inf: all at once)")
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(16, 128), metavar=("MIN", "MAX"))
    parser.add_argument("--max-tokens", type=int, nargs=2, default=(16, 128), metavar=("MIN", "MAX"))
    parser.add_argument("--max-running", type=int, default=256)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--num-pages", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    return parser.parse_args()


def workload(args: argparse.Namespace, vocab: int) -> tuple[list[list[int]], list[int]]:
    spec = WorkloadSpec("serve", args.requests, tuple(args.prompt_len), tuple(args.max_tokens), 10000, 0.0)
    drawn = make_workload(spec, vocab, args.seed)
    return [r.prompt_ids for r in drawn.requests], [r.max_tokens for r in drawn.requests]


def offline(llm: LLM, prompts: list[list[int]], lengths: list[int]) -> dict[str, float]:
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    llm.generate(prompts[:4], params[:4])  # warm-up
    llm.reset_prefix_cache()
    started = time.perf_counter()
    results = llm.generate(prompts, params)
    wall = time.perf_counter() - started
    tokens = sum(len(r["token_ids"]) for r in results)
    return {"wall_s": wall, "tokens": tokens, "tok_per_s": tokens / wall}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def one_request(client, model: str, prompt: list[int], max_tokens: int, delay: float) -> dict:
    await asyncio.sleep(delay)
    sent = time.perf_counter()
    first = None
    tokens = 0
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
    async for chunk in stream:
        if first is None and chunk.choices:
            first = time.perf_counter()
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    done = time.perf_counter()
    first = first or done
    return {"ttft": first - sent, "tpot": (done - first) / max(1, tokens - 1), "tokens": tokens, "end": done}


async def online_run(port: int, model: str, prompts: list[list[int]], lengths: list[int], rate: float,
                     seed: int) -> dict[str, float]:
    import openai  # the official client, as users would send the requests

    rng = random.Random(seed + 1)
    delays, at = [], 0.0
    for _ in prompts:
        delays.append(at)
        at += rng.expovariate(rate) if rate != float("inf") else 0.0
    async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=600,
                                  max_retries=0) as client:
        started = time.perf_counter()
        done = await asyncio.gather(*(one_request(client, model, p, n, d) for p, n, d in zip(prompts, lengths, delays)))
    wall = max(r["end"] for r in done) - started
    tokens = sum(r["tokens"] for r in done)
    ttft = Percentiles.of([r["ttft"] for r in done])
    return {"wall_s": wall, "tokens": tokens, "tok_per_s": tokens / wall, "ttft_mean_s": ttft.mean,
            "ttft_p50_s": ttft.p50, "ttft_p99_s": ttft.p99, "tpot_mean_s": statistics.mean(r["tpot"] for r in done)}


def online(llm: LLM, prompts: list[list[int]], lengths: list[int], rate: float, seed: int) -> dict[str, float]:
    import uvicorn

    from minisgl_cli.serve.api import create_app
    from minisgl_cli.serve.bridge import EngineBridge

    llm.reset_prefix_cache()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(EngineBridge(llm, "bench")), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    engine = threading.Thread(target=llm.serve_forever, daemon=True)
    engine.start()
    http = threading.Thread(target=server.run, daemon=True)  # off the main thread: no signal handlers
    http.start()
    while not server.started:
        time.sleep(0.05)
    try:
        return asyncio.run(online_run(port, "bench", prompts, lengths, rate, seed))
    finally:
        server.should_exit = True
        http.join()
        llm.stop()
        engine.join()


def main() -> None:
    args = parse_args()
    llm = LLM(args.model, max_running_req=args.max_running, tp=args.tp, dtype=args.dtype, num_pages=args.num_pages)
    prompts, lengths = workload(args, llm.vocab_size)
    off = offline(llm, prompts, lengths)
    on = online(llm, prompts, lengths, args.rate, args.seed)
    llm.close()
    figures = {"requests": args.requests, "rate": args.rate, "offline": off, "online": on,
               "online_over_offline": on["tok_per_s"] / off["tok_per_s"],
               "rate_bound_tok_per_s": args.rate * statistics.mean(lengths)}
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{args.requests} requests, prompt {args.prompt_len[0]}-{args.prompt_len[1]}, "
          f"max_tokens {args.max_tokens[0]}-{args.max_tokens[1]}, {sum(lengths)} output tokens")
    print(f"offline  {off['tok_per_s']:10.1f} tok/s  ({off['wall_s']:.2f} s)")
    print(f"online   {on['tok_per_s']:10.1f} tok/s  ({on['wall_s']:.2f} s) at {args.rate} req/s "
          f"= {figures['online_over_offline']:.2f}x offline (the rate allows at most "
          f"{figures['rate_bound_tok_per_s']:.0f} tok/s)")
    print(f"TTFT     mean {on['ttft_mean_s'] * 1e3:.1f} ms, p50 {on['ttft_p50_s'] * 1e3:.1f} ms, "
          f"p99 {on['ttft_p99_s'] * 1e3:.1f} ms; TPOT mean {on['tpot_mean_s'] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
