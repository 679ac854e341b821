"""A split-K Triton GEMM for a decode step's linears, against cuBLAS, on CUDA: would many small programs that
stream the weight beat cuBLAS's few large tiles at 8-256 rows?

At decode row counts cuBLAS reads the Qwen3-0.6B linears' weights at 0.6-2 TB/s (docs/BENCHMARKS.md, "cuBLAS's
linears at decode row counts"): a linear's output has few tiles of cuBLAS's size, so a few dozen SMs each stream a
large slice of the weight. Here every program owns BLOCK_N outputs and one of S slices of the inputs, for all rows
in BLOCK_M-row blocks, so a linear is N / BLOCK_N x S programs (128 for o_proj at BLOCK_N 64 and S 8). With S > 1
the programs write float32 partials [S, rows, N], which the kernel after the linear would sum as it reads them (as
core/kernels/split_k.py's add+RMSNorm does for o_proj and down); the table gives the GEMM alone and, beside it,
the GEMM plus a torch sum of the partials, the most that folding could cost.

Each figure is the median of ten CUDA-graph replays of 20 products over eight copies of the weight (so the reads
come from HBM, not L2), in microseconds; the best Triton configuration per linear and row count is printed with
the weight's read rate, and a step's four layer linears (28 layers) are summed for both.

    . scripts/gpu_env.sh && python3 scripts/gpu_skinny_splitk.py [--rows 8,32,64,128,192,256]
    TRITON_INTERPRET=1 python3 scripts/gpu_skinny_splitk.py --check     # the kernel's products on the CPU
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import gpu_gemm_rows  # beside this script: Python puts a script's folder on its path
from gpu_gemm_rows import LAYERS, replay_us

SHAPES = {name: shape for name, shape in gpu_gemm_rows.SHAPES.items() if name != "lm_head"}  # [out, in]
COPIES = 8  # gate_up's 12 MB eight times over is more than the L2 holds
BLOCK_K = 128


@triton.jit
def splitk_kernel(x_ptr, w_ptr, out_ptr, rows, k_per_split, in_features, out_features,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (n, s, m): outputs [n*BLOCK_N, (n+1)*BLOCK_N) of rows [m*BLOCK_M, ...) over inputs
    [s*k_per_split, (s+1)*k_per_split), into slice s of out [S, rows, out_features] (its dtype: bf16 when S is
    1, float32 partials otherwise). The weight is [out_features, in_features], row-major, as nn.Linear keeps it."""
    n, s, m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    first = s * k_per_split
    x_rows = x_ptr + rm[:, None].to(tl.int64) * in_features
    w_rows = w_ptr + rn[:, None].to(tl.int64) * in_features
    row_ok = rm[:, None] < rows
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(first, first + k_per_split, BLOCK_K):
        x = tl.load(x_rows + (k + rk)[None, :], mask=row_ok, other=0.0)
        w = tl.load(w_rows + (k + rk)[None, :])
        acc = tl.dot(x, tl.trans(w), acc)
    out = out_ptr + (s * rows + rm[:, None]).to(tl.int64) * out_features + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok)


def splitk_linear(x: torch.Tensor, weight: torch.Tensor, splits: int, block_m: int, block_n: int,
                  num_stages: int = 4, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, K] @ weight.T: [rows, N] in x's dtype when ``splits`` is 1, else float32 partials [splits, rows, N]."""
    rows, k = x.shape
    n = weight.shape[0]
    if k % (splits * BLOCK_K) or n % block_n:
        raise ValueError(f"[{n}, {k}] does not tile into {block_n} outputs and {splits} slices of {BLOCK_K}")
    if out is None:
        out = torch.empty((splits, rows, n), device=x.device, dtype=x.dtype if splits == 1 else torch.float32)
    grid = (n // block_n, splits, triton.cdiv(rows, block_m))
    splitk_kernel[grid](x, weight, out, rows, k // splits, k, n, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK_K,
                        num_warps=4, num_stages=num_stages)
    return out


def block_ms(rows: int) -> list[int]:
    """Row blocks worth trying: the smallest that holds every row (at least 16, tl.dot's least), and 64 when
    that would be larger."""
    whole = max(16, triton.next_power_of_2(rows))
    return sorted({min(whole, 128), 64} if whole > 64 else {whole})


def check() -> None:
    """The kernel's products against torch's on small shapes (run under TRITON_INTERPRET=1 on the CPU)."""
    torch.manual_seed(0)
    for rows, n, k, splits, block_m, block_n in [(5, 64, 256, 2, 16, 32), (17, 128, 512, 4, 16, 64),
                                                 (3, 32, 128, 1, 16, 32)]:
        x = torch.randn(rows, k)
        w = torch.randn(n, k)
        got = splitk_linear(x, w, splits, block_m, block_n, num_stages=1)
        want = x @ w.T
        total = got.sum(0) if splits > 1 else got[0]
        assert torch.allclose(total, want, atol=1e-3, rtol=1e-4), (rows, n, k, splits, (total - want).abs().max())
        print(f"rows {rows}, [{n}, {k}], {splits} slices: max diff {(total - want).abs().max().item():.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="8,32,64,128,192,256")
    parser.add_argument("--check", action="store_true", help="check the kernel's products and stop")
    args = parser.parse_args()
    if args.check:
        check()
        return
    torch.manual_seed(0)
    print("linear rows: cuBLAS us | best split-K Triton us (+ summing its partials) [BLOCK_M, BLOCK_N, S] | "
          "weight read TB/s, cuBLAS / Triton", flush=True)
    for rows in (int(r) for r in args.rows.split(",")):
        step_cublas = step_triton = 0.0
        for name, (n, k) in SHAPES.items():
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(COPIES)]
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            cublas = replay_us(lambda i: F.linear(x, weights[i]), COPIES)
            want = F.linear(x, weights[0]).float()
            best = None
            for block_m, block_n, splits in itertools.product(block_ms(rows), (64, 128), (1, 2, 4, 8)):
                if k % (splits * BLOCK_K):
                    continue
                out = torch.empty((splits, rows, n), device="cuda",
                                  dtype=torch.bfloat16 if splits == 1 else torch.float32)
                try:
                    got = splitk_linear(x, weights[0], splits, block_m, block_n, out=out).float().sum(0)
                except triton.runtime.errors.OutOfResources:  # too large a tile for shared memory
                    continue
                err = (got - want).abs().max().item()
                if err > 0.05 * want.abs().max().item():
                    print(f"  {name} {rows}: [{block_m}, {block_n}, {splits}] wrong by {err:.3g}", flush=True)
                    continue
                us = replay_us(lambda i: splitk_linear(x, weights[i], splits, block_m, block_n, out=out), COPIES)
                if best is None or us < best[0]:
                    best = (us, block_m, block_n, splits, out)
            us, block_m, block_n, splits, out = best
            summed = us if splits == 1 else replay_us(
                lambda i: splitk_linear(x, weights[i], splits, block_m, block_n, out=out).sum(0), COPIES)
            step_cublas += cublas * LAYERS
            step_triton += us * LAYERS
            print(f"{name:8s} {rows:4d}: {cublas:6.1f} | {us:6.1f} (+sum {summed:6.1f}) [{block_m}, {block_n}, "
                  f"{splits}] | {2 * n * k / cublas / 1e6:5.2f} / {2 * n * k / us / 1e6:5.2f}", flush=True)
        print(f"rows {rows}: a step's layer linears {step_cublas / 1e3:.3f} ms through cuBLAS, "
              f"{step_triton / 1e3:.3f} ms through the split-K kernel (partials unsummed)", flush=True)


if __name__ == "__main__":
    main()
