"""The floor of a benchmark: the least time any engine could take on this device for this workload.

Two ceilings are measured in the run itself (same process, same neighbours): the device's memory bandwidth
and its matmul rate in the engine's dtype. The bandwidth is the better of one large tensor copy (bytes read
plus bytes written per second) and, on a CPU, one read-only pass (a sum): a CPU's copy also pays for the
written lines' reads, so there it understated what a decode step, which only reads, gets (the C decode step's
products ran faster than the copy rate).
The workload is then served by an ideal engine: every prompt prefilled at the matmul rate, then every
request decoding in one batch from the first step, each step taking the longer of moving its bytes (every
weight once, the KV cache of every running request) and doing its FLOPs. No engine can beat that schedule,
so ``floor_s / wall_s`` is the fraction of the device the engine turned into work.

Batch-1 decode's floor is one step of a single request: the weights once plus its KV cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from core.bench.flops import body_params, matmul_gflops
from core.bench.workload import BenchRequest
from core.model_config import ModelConfig


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float  # GB/s, bytes read plus bytes written
    matmul_gflops: float  # in the engine's dtype
    read_gbps: float = 0.0  # GB/s of a read-only pass, where measured (a CPU); 0: not measured

    @property
    def stream_gbps(self) -> float:
        """The bandwidth the floors read their bytes at: the better of the copy and the read-only pass."""
        return max(self.copy_gbps, self.read_gbps)


def copy_gbps(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Best-of-``repeats`` GB/s of one device-to-device copy, counting the bytes read and the bytes written."""
    src = torch.empty(megabytes << 20, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    best = float("inf")
    for i in range(repeats + 1):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        if i:  # the first copy warms up the allocator and the pages
            best = min(best, time.perf_counter() - start)
    return 2 * src.numel() / best / 1e9


def read_gbps(device: torch.device, megabytes: int = 256, repeats: int = 5) -> float:
    """Best-of-``repeats`` GB/s of one read-only pass over a float32 tensor (its sum: a few adds per 64 bytes)."""
    src = torch.empty(megabytes << 18, dtype=torch.float32, device=device).uniform_()
    best = float("inf")
    for i in range(repeats + 1):
        _sync(device)
        start = time.perf_counter()
        src.sum()
        _sync(device)
        if i:
            best = min(best, time.perf_counter() - start)
    return src.numel() * 4 / best / 1e9


def cuda_matmul_gflops(device: torch.device, dtype: torch.dtype, size: int = 8192, repeats: int = 10) -> float:
    """GFLOP/s of ``size``-square matmuls on random data, timed with CUDA events after a warm-up."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        torch.matmul(a, b)
    end.record()
    end.synchronize()
    return 2 * size ** 3 * repeats / (start.elapsed_time(end) / 1e3) / 1e9


def measure_ceilings(device: torch.device, dtype: torch.dtype) -> Ceilings:
    if device.type == "cuda":
        with torch.cuda.device(device):
            return Ceilings(copy_gbps(device, megabytes=2048), cuda_matmul_gflops(device, dtype))
    return Ceilings(copy_gbps(device), matmul_gflops(dtype=dtype), read_gbps(device))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class ModelCosts:
    """What one token costs the model: bytes of weights read per step, KV bytes per cached token, FLOPs."""

    weight_bytes: float  # decoder body and LM head, read once per step (the embedding lookup is negligible)
    kv_bytes_per_token: float  # K and V of every layer, scales included
    flops_per_token: float  # body and LM head, 2 per weight
    attn_flops_per_pair: float  # QK^T and PV for one query-key pair over every layer
    # the LM head's part of flops_per_token: a prompt passes it once (for its first token), not once a token
    head_flops: float = 0.0

    @classmethod
    def of(cls, cfg: ModelConfig, weight_elem_bytes: float, kv_bytes_per_token: float, tp: int = 1,
           head_elem_bytes: float | None = None) -> "ModelCosts":
        """Per device: with ``tp`` ranks each holds and reads 1/tp of the weights and of the KV cache.
        ``head_elem_bytes``: the LM head's bytes per weight where they differ from the body's (int8 linears on
        torch keep a float32 head)."""
        lm_head = cfg.vocab_size * cfg.hidden_size
        body = body_params(cfg)
        head_bytes = weight_elem_bytes if head_elem_bytes is None else head_elem_bytes
        return cls((body * weight_elem_bytes + lm_head * head_bytes) / tp, kv_bytes_per_token / tp,
                   2 * (body + lm_head) / tp, 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim / tp,
                   2 * lm_head / tp)


@dataclass(frozen=True)
class Floor:
    """The ideal engine's time for the workload on the measured ceilings, and what it is made of."""

    seconds: float
    prefill_s: float
    decode_s: float
    kv_read_bytes: float
    weight_read_bytes: float
    decode_steps: int
    prefill_flops: float
    decode_flops: float

    def to_dict(self) -> dict[str, Any]:
        return {"floor_s": round(self.seconds, 4), "prefill_s": round(self.prefill_s, 4),
                "decode_s": round(self.decode_s, 4), "kv_read_gb": _sig(self.kv_read_bytes / 1e9),
                "weight_read_gb": _sig(self.weight_read_bytes / 1e9), "decode_steps": self.decode_steps,
                "prefill_tflop": _sig(self.prefill_flops / 1e12), "decode_tflop": _sig(self.decode_flops / 1e12)}


def _sig(value: float) -> float:
    """Four significant digits, so a tiny CPU workload's figures do not round to zero."""
    return float(f"{value:.4g}")


def workload_floor(costs: ModelCosts, requests: list[BenchRequest], ceilings: Ceilings) -> Floor:
    """Prefill of every prompt at the matmul rate (every token through the decoder, the LM head on the last
    one), then decode steps 1, 2, ... with every request that still has tokens to make; step s reads the
    weights once and ``prompt + s`` cached tokens of each such request.

    The first token of each request comes from its prefill, so a request of ``max_tokens`` takes part in
    ``max_tokens - 1`` decode steps.
    """
    bandwidth = ceilings.stream_gbps * 1e9
    rate = ceilings.matmul_gflops * 1e9
    body_flops = costs.flops_per_token - costs.head_flops
    prefill_flops = sum(len(r.prompt_ids) * body_flops + costs.head_flops  # logits for the last position only
                        + len(r.prompt_ids) * (len(r.prompt_ids) + 1) / 2 * costs.attn_flops_per_pair
                        for r in requests)
    prefill_s = max(prefill_flops / rate, costs.weight_bytes / bandwidth) if requests else 0.0
    steps = max((r.max_tokens for r in requests), default=1) - 1
    # requests running at step s, and the sum of their prompt lengths, from a sweep over max_tokens
    ending = [0] * (steps + 2)
    prompt_sum_ending = [0] * (steps + 2)
    for r in requests:
        last = r.max_tokens - 1  # the last decode step this request takes part in
        if last >= 1:
            ending[last] += 1
            prompt_sum_ending[last] += len(r.prompt_ids)
    running = sum(ending)
    prompt_sum = sum(prompt_sum_ending)
    decode_s = kv_bytes = decode_flops = 0.0
    for s in range(1, steps + 1):
        context = prompt_sum + running * s  # keys each request's new token attends to, summed over requests
        step_bytes = costs.weight_bytes + context * costs.kv_bytes_per_token
        step_flops = running * costs.flops_per_token + context * costs.attn_flops_per_pair
        decode_s += max(step_bytes / bandwidth, step_flops / rate)
        kv_bytes += context * costs.kv_bytes_per_token
        decode_flops += step_flops
        running -= ending[s]
        prompt_sum -= prompt_sum_ending[s]
    return Floor(prefill_s + decode_s, prefill_s, decode_s, kv_bytes, costs.weight_bytes * steps, steps,
                 prefill_flops, decode_flops)


def batch1_floor_ms(costs: ModelCosts, request: BenchRequest, ceilings: Ceilings) -> float:
    """One decode step of one request at the middle of its generation: weights once plus its KV cache."""
    context = len(request.prompt_ids) + request.max_tokens / 2
    seconds = (costs.weight_bytes + context * costs.kv_bytes_per_token) / (ceilings.stream_gbps * 1e9)
    return seconds * 1e3
