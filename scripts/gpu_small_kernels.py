"""The decode step's two own elementwise kernels at each warp count: the add+RMSNorm that sums split-K partials
(core/kernels/split_k.py) and the QK-norm/RoPE/KV-store kernel (core/kernels/fused_qkv.py), on the Qwen3-0.6B shape
with a head-major pool in pages of 128, at decode row counts.

On an H200 each launch took 3.6 us on average over the nano-vllm workload (docs/BENCHMARKS.md, session 42's budget)
against 2.3 for flashinfer's SiLU-and-mul on similar bytes: this says whether a program's warps are why. Medians of
CUDA-graph replays (scripts/gpu_gemm_rows.py's ``replay_us``); each warp count's output is checked against the
default's first.

    . scripts/gpu_env.sh && python3 scripts/gpu_small_kernels.py [--rows 32,64,128,192,256]
"""

from __future__ import annotations

import argparse

import torch

from core.kernels.fused_qkv import qkv_norm_rope_store
from core.kernels.split_k import add_rms_norm_partials
from core.kvcache.pool import KVPool
from gpu_gemm_rows import replay_us  # beside this script: Python puts a script's folder on its path

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, PAGE = 1024, 16, 8, 128, 128
WARPS = (1, 2, 4, 8, 16)


def norm_case(rows: int):
    """The add+RMSNorm of two float32 partials into a bf16 residual: run(warps, fresh) (``fresh``: on a copy of
    the first residual, so that outputs compare; the timed launches update another one in place)."""
    partials = torch.randn(2, rows, HIDDEN, device="cuda")
    first = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    residual = first.clone()  # what the timed launches update
    weight = torch.rand(HIDDEN, device="cuda", dtype=torch.bfloat16) + 0.5
    return lambda warps, fresh=False: add_rms_norm_partials(partials, first.clone() if fresh else residual,
                                                            weight, 1e-6, warps)[0]


def qkv_case(rows: int):
    """One layer's QK-norm, RoPE and KV store for ``rows`` decode tokens: run(warps, fresh) (q depends on nothing
    it writes)."""
    pool = KVPool(1, 4 * rows, PAGE, KV_HEADS, HEAD_DIM, torch.bfloat16, torch.device("cuda"), head_major=True)
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    positions = torch.randint(0, 2048, (rows,), device="cuda")
    out_loc = torch.arange(rows, device="cuda") * PAGE + 5  # one slot in each request's own page
    cos_sin = torch.randn(4096, HEAD_DIM, device="cuda")
    weight = torch.rand(HEAD_DIM, device="cuda", dtype=torch.bfloat16) + 0.5
    return lambda warps, fresh=False: qkv_norm_rope_store(
        qkv, HEADS, KV_HEADS, HEAD_DIM, positions, cos_sin, weight, weight, 1e-6, pool.k_layers[0], pool.v_layers[0],
        out_loc, head_block=pool.head_block, num_warps=warps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="32,64,128,192,256")
    args = parser.parse_args()
    torch.manual_seed(0)
    print("kernel, rows: us a launch at " + ", ".join(f"{w} warps" for w in WARPS) + " (default: norm 4, qkv 4)")
    for name, case in (("add+RMSNorm of partials", norm_case), ("QK-norm/RoPE/KV store", qkv_case)):
        for rows in (int(r) for r in args.rows.split(",")):
            run = case(rows)
            reference = run(4, fresh=True).clone()  # the default's output
            cells = []
            for warps in WARPS:
                diff = (run(warps, fresh=True).float() - reference.float()).abs().max().item()
                cells.append(f"{replay_us(lambda i: run(warps), copies=1):5.2f}" + ("" if diff < 0.05 else "(!)"))
            print(f"{name}, {rows:3d}: " + "  ".join(cells), flush=True)
    from flashinfer.activation import silu_and_mul

    for rows in (int(r) for r in args.rows.split(",")):  # the reference: a library kernel on similar bytes
        x = torch.randn(rows, 6144, device="cuda", dtype=torch.bfloat16)
        print(f"flashinfer SiLU-and-mul, {rows:3d}: {replay_us(lambda i: silu_and_mul(x), copies=1):5.2f}", flush=True)


if __name__ == "__main__":
    main()
