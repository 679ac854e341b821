"""The CPU ceiling and the model's arithmetic: how many FLOPs a workload needs, and how fast this machine
can do them at best.

The ceiling is a large square float32 matmul timed in the same process (so it sees the same threads and the
same neighbours on a shared machine), through both GEMMs the engine uses: the BLAS behind ``torch.matmul``
and oneDNN with a packed weight; the faster one counts. The model's FLOPs count every matmul the engine
must do and nothing it need not: the decoder body for every prompt and generated token fed back,
attention over each token's context, and the LM head only where a token is sampled.
"""

from __future__ import annotations

import time

import torch

from core.bench.workload import Workload
from core.kernels.cpu.onednn_packed import pack_weight, packed_linear, packing_available
from core.model_config import ModelConfig


def matmul_gflops(size: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Best-of-``repeats`` GFLOP/s of one ``size``-square matmul (2 * size**3 FLOPs), the faster GEMM's."""
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    out = torch.empty(size, size, dtype=dtype)
    candidates = [lambda: torch.matmul(a, b, out=out)]
    if packing_available(torch.device("cpu"), dtype):
        packed = pack_weight(b)
        candidates.append(lambda: packed_linear(a, packed))
    best = float("inf")
    for run in candidates:
        run()  # warm up the kernels and the caches
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best / 1e9


def body_params(cfg: ModelConfig) -> int:
    """Weights multiplied per token in the decoder layers (embedding lookup and LM head excluded)."""
    q = cfg.num_heads * cfg.head_dim
    kv = cfg.num_kv_heads * cfg.head_dim
    attention = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size
    mlp = 3 * cfg.hidden_size * cfg.intermediate_size
    return cfg.num_layers * (attention + mlp)


def workload_flops(cfg: ModelConfig, workload: Workload) -> float:
    """FLOPs to serve the workload once: 2 per weight per token, plus QK^T and PV over each token's context.

    Every prompt token and every generated token but the last passes through the body; each request samples
    ``max_tokens`` times through the LM head.
    """
    per_token = 2 * body_params(cfg)
    attn_per_pair = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim  # QK^T and PV, one query-key pair
    lm_head = 2 * cfg.vocab_size * cfg.hidden_size
    total = 0.0
    for req in workload.requests:
        tokens = len(req.prompt_ids) + req.max_tokens - 1
        pairs = tokens * (tokens + 1) / 2  # a token at position p attends to p + 1 keys
        total += tokens * per_token + pairs * attn_per_pair + req.max_tokens * lm_head
    return total
