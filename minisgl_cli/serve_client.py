"""The load generator of ``minisgl bench --serve``: the workload's requests sent to an OpenAI-compatible server
as streaming completions, at a Poisson rate, each timed from its send.

One asyncio client in this process holds every request open at once, as ``vllm bench serve`` does. Requests
carry their prompts as token ids, greedy, with ``ignore_eos``, so every one generates exactly its max_tokens and
the work is the same at every rate. Arrivals are seeded: the same ``--seed`` sends the same shapes at the same
offsets. The client parses the event stream itself (httpx's lines, no SDK objects per chunk): its own time per
chunk is part of what it measures, and a single Python process is the ceiling of what it can drive.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import AsyncIterator
from typing import Callable

import httpx

from core.bench.serve_report import RateResult, RequestTiming
from core.bench.workload import BenchRequest, Workload
from core.errors import InvalidParamsError

def parse_rates(text: str) -> tuple[float, ...]:
    """``16,32,inf`` -> (16.0, 32.0, inf): requests per second, each > 0, or 'inf' for every request at once."""
    rates = []
    for part in text.split(","):
        word = part.strip()
        try:
            rate = float(word)
        except ValueError:
            rate = math.nan
        if not rate > 0:  # NaN and the unparsable fail here too
            raise InvalidParamsError(f"a rate is requests per second above 0, or 'inf', got {word!r} "
                                     f"(a comma-separated list, e.g. 16,32,inf)")
        rates.append(rate)
    return tuple(rates)


def arrival_offsets(count: int, rate: float, seed: int) -> list[float]:
    """When each request is sent, in seconds from the start: a Poisson process of ``rate`` (exponential gaps,
    seeded), the first at 0; all at 0 for an infinite rate."""
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(seed)
    offsets, at = [], 0.0
    for _ in range(count):
        offsets.append(at)
        at += rng.expovariate(rate)
    return offsets


def auth_headers(api_key: str | None) -> dict[str, str]:
    """What a server started with ``--api-key`` wants on every /v1/ request."""
    return {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}


def served_model(url: str, api_key: str | None = None) -> str:
    """The name the server answers to: the first of GET /v1/models. A server that cannot be reached or refuses
    is a one-line error."""
    try:
        response = httpx.get(f"{url}/v1/models", headers=auth_headers(api_key), timeout=30)
    except httpx.HTTPError as exc:
        raise InvalidParamsError(f"cannot reach a server at {url}: {exc}") from None
    if response.status_code != 200:
        hint = "; give its key with --api-key" if response.status_code == 401 else ""
        raise InvalidParamsError(f"the server at {url} answered GET /v1/models with HTTP {response.status_code}: "
                                 f"{_message(response.text)}{hint}")
    return response.json()["data"][0]["id"]


def run_rate(url: str, model: str, workload: Workload, rate: float, seed: int,
             on_done: Callable[[int, int], None] = lambda done, total: None, api_key: str | None = None) \
        -> RateResult:
    """Send every request of ``workload`` at ``rate``; ``on_done(done, total)`` hears each one end."""
    return asyncio.run(_run_rate(url, model, workload.requests, rate, seed, on_done, auth_headers(api_key)))


async def _run_rate(url: str, model: str, requests: list[BenchRequest], rate: float, seed: int,
                    on_done: Callable[[int, int], None], headers: dict[str, str]) -> RateResult:
    offsets = arrival_offsets(len(requests), rate, seed)
    done = 0

    async def one(request: BenchRequest, send_at: float) -> RequestTiming:
        nonlocal done
        delay = send_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        timing = await _send(client, model, request)
        done += 1
        on_done(done, len(requests))
        return timing

    # no pool limit: at an infinite rate every request is open at once, and a queue in the client would count
    # as the server's time to first token
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(None, connect=60), limits=limits,
                                 headers=headers) as client:
        start = time.perf_counter()
        timings = await asyncio.gather(*(one(r, start + at) for r, at in zip(requests, offsets)))
        wall = time.perf_counter() - start
    return RateResult(rate, wall, list(timings))


async def _send(client: httpx.AsyncClient, model: str, request: BenchRequest) -> RequestTiming:
    body = {"model": model, "prompt": request.prompt_ids, "max_tokens": request.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first = last = 0.0
    gaps: list[float] = []
    tokens = 0

    def failed(why: str) -> RequestTiming:
        return RequestTiming(False, tokens, (first or time.perf_counter()) - sent, time.perf_counter() - sent,
                             tuple(gaps), why)

    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                return failed(f"HTTP {response.status_code}: {_message((await response.aread()).decode())}")
            async for line in sse_lines(response):
                if not line.startswith("data:"):
                    continue
                now = time.perf_counter()
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    return failed(str(event["error"].get("message", event["error"])))
                if event.get("choices"):
                    if first:
                        gaps.append(now - last)
                    else:
                        first = now
                    last = now
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
            else:
                return failed("the stream ended before [DONE]")
    except httpx.HTTPError as exc:
        return failed(f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    if not first:
        return failed("the stream carried no token")
    return RequestTiming(True, tokens, first - sent, end - sent, tuple(gaps))


async def sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The stream's lines as server-sent events end them: at CR or LF only. httpx's ``aiter_lines`` also ends a
    line at the Unicode line breaks (U+2028, U+0085, ...), which a server may leave raw inside its JSON."""
    pending = ""
    async for text in response.aiter_text():
        *lines, pending = (pending + text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
        for line in lines:
            yield line
    if pending:
        yield pending


def _message(body: str) -> str:
    """An OpenAI-shaped error's message, else the body's first line."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.strip().splitlines()[0] if body.strip() else "(no body)"
