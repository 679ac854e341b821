"""How long one long text prompt holds up every other stream of a running server.

    python3 scripts/stall_probe.py http://127.0.0.1:8000 SmolLM2-135M-Instruct --chars 2000000 --max-tokens 300

Eight streams of ``--max-tokens`` greedy tokens start at once; a second later one more client sends a prompt of
``--chars`` characters (refused as too long for the context, so only its tokenizing costs anything). Printed: the
long prompt's status and time, and the gaps between the streams' chunks (p50, p99, the longest).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx


async def stream(client: httpx.AsyncClient, model: str, max_tokens: int, gaps: list[float]) -> None:
    body = {"model": model, "prompt": "once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "temperature": 0}
    last = None
    async with client.stream("POST", "/v1/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now


async def long_prompt(client: httpx.AsyncClient, model: str, chars: int) -> tuple[int, float]:
    await asyncio.sleep(1.0)
    start = time.perf_counter()
    reply = await client.post("/v1/completions", json={"model": model, "max_tokens": 4,
                                                       "prompt": "hello world, this is long. " * (chars // 27)})
    return reply.status_code, time.perf_counter() - start


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("model")
    parser.add_argument("--chars", type=int, default=2_000_000)
    parser.add_argument("--max-tokens", type=int, default=300)
    args = parser.parse_args()
    gaps: list[float] = []
    async with httpx.AsyncClient(base_url=args.url, timeout=300) as client:
        *_, (status, seconds) = await asyncio.gather(*(stream(client, args.model, args.max_tokens, gaps)
                                                       for _ in range(8)), long_prompt(client, args.model, args.chars))
    gaps.sort()
    print(f"long prompt: status {status} in {seconds:.2f} s; gaps between chunks: p50 {gaps[len(gaps) // 2] * 1e3:.1f} "
          f"ms, p99 {gaps[int(len(gaps) * 0.99)] * 1e3:.1f} ms, longest {gaps[-1] * 1e3:.1f} ms")


if __name__ == "__main__":
    asyncio.run(main())
