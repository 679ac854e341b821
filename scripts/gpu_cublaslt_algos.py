"""Every cuBLASLt algorithm its heuristics offer for the decode linears, timed: is there a faster kernel than the
one torch's cuBLAS call picks, at a decode step's row counts on the Qwen3-0.6B shapes?

torch takes the heuristics' first choice (through cuBLAS or cuBLASLt, scripts/gpu_gemm_rows.py); this asks
cuBLASLt (through ctypes, from the library torch loaded) for up to ``--algos`` candidates for y = x W^T in bf16
with float32 accumulation, times each in CUDA-graph replays over four weight copies (HBM reads, as in
gpu_gemm_rows.py), checks its product against torch's, and prints torch's time, the best candidate's and its
index in the heuristics' ranking.

    . scripts/gpu_env.sh && python3 scripts/gpu_cublaslt_algos.py [--rows 16,32,64,96,128,192,256] [--algos 32]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os

import torch
import torch.nn.functional as F

from gpu_gemm_rows import SHAPES, replay_us  # beside this script: Python puts a script's folder on its path

CUBLAS_COMPUTE_32F = 68
CUDA_R_32F, CUDA_R_16BF = 0, 14
DESC_TRANSA, DESC_TRANSB = 3, 4
OP_N, OP_T = 0, 1
PREF_MAX_WORKSPACE_BYTES = 1
WORKSPACE = 32 << 20


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def load_library() -> ctypes.CDLL:
    for name in ("libcublasLt.so.13", "libcublasLt.so.12"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    roots = [os.path.dirname(torch.__file__), os.path.join(os.path.dirname(torch.__file__), "..", "nvidia")]
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, "**", "libcublasLt.so*"), recursive=True)):
            return ctypes.CDLL(path)
    raise OSError("libcublasLt not found")


class Lt:
    """y [rows, out] = x [rows, in] W [out, in]^T through cublasLtMatmul with a chosen algorithm."""

    def __init__(self) -> None:
        self.lib = load_library()
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "create")
        self.workspace = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"cublasLt {what}: status {status}")

    def layout(self, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(out), CUDA_R_16BF, ctypes.c_uint64(rows),
                                                        ctypes.c_uint64(cols), ctypes.c_int64(ld)), "layout")
        return out

    def problem(self, rows: int, out_features: int, in_features: int):
        """The descriptors of the product in column-major terms: D^T [out, rows] = W [in, out]^T-as-stored x^T."""
        desc = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc")
        for attribute, op in ((DESC_TRANSA, OP_T), (DESC_TRANSB, OP_N)):
            value = ctypes.c_int32(op)
            self._check(self.lib.cublasLtMatmulDescSetAttribute(desc, attribute, ctypes.byref(value),
                                                                ctypes.c_size_t(4)), "trans")
        a = self.layout(in_features, out_features, in_features)  # W, row-major [out, in]
        b = self.layout(in_features, rows, in_features)  # x, row-major [rows, in]
        d = self.layout(out_features, rows, out_features)  # y, row-major [rows, out]
        return desc, a, b, d

    def algorithms(self, problem, count: int) -> list[HeuristicResult]:
        desc, a, b, d = problem
        pref = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
        size = ctypes.c_uint64(WORKSPACE)
        self._check(self.lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size),
                                                                  ctypes.c_size_t(8)), "workspace")
        results = (HeuristicResult * count)()
        found = ctypes.c_int()
        self._check(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, a, b, d, d, pref, count, results,
                                                            ctypes.byref(found)), "heuristic")
        return [results[i] for i in range(found.value) if results[i].state == 0]

    def matmul(self, problem, algo: HeuristicResult, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> None:
        desc, a, b, d = problem
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._check(self.lib.cublasLtMatmul(
            self.handle, desc, ctypes.byref(alpha), ctypes.c_void_p(weight.data_ptr()), a,
            ctypes.c_void_p(x.data_ptr()), b, ctypes.byref(beta), ctypes.c_void_p(y.data_ptr()), d,
            ctypes.c_void_p(y.data_ptr()), d, ctypes.byref(algo.algo), ctypes.c_void_p(self.workspace.data_ptr()),
            ctypes.c_size_t(WORKSPACE), stream), "matmul")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="16,32,64,96,128,192,256")
    parser.add_argument("--algos", type=int, default=32)
    parser.add_argument("--linears", default="qkv,o_proj,gate_up,down")
    args = parser.parse_args()
    torch.manual_seed(0)
    lt = Lt()
    print("linear rows: torch us | best cuBLASLt us (its rank among N candidates) | the heuristics' first us")
    saved = {}
    for rows in (int(r) for r in args.rows.split(",")):
        for name in args.linears.split(","):
            out_features, in_features = SHAPES[name]
            weights = [torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16) / 32
                       for _ in range(4)]
            x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(rows, out_features, device="cuda", dtype=torch.bfloat16)
            reference = F.linear(x, weights[0]).float()
            torch_us = replay_us(lambda i: F.linear(x, weights[i]))
            problem = lt.problem(rows, out_features, in_features)
            timed = []
            for rank, algo in enumerate(lt.algorithms(problem, args.algos)):
                try:
                    lt.matmul(problem, algo, x, weights[0], y)
                    torch.cuda.synchronize()
                    if (y.float() - reference).abs().max().item() > 0.05:
                        print(f"  {name} {rows} candidate {rank}: wrong product, skipped")
                        continue
                    timed.append((replay_us(lambda i: lt.matmul(problem, algo, x, weights[i], y)), rank))
                except RuntimeError as error:
                    print(f"  {name} {rows} candidate {rank}: {error}")
            if not timed:
                print(f"{name:8s} {rows:4d}: {torch_us:6.1f} | no candidate ran")
                continue
            best_us, best_rank = min(timed)
            first = next((us for us, rank in timed if rank == 0), float("nan"))
            saved[name, rows] = torch_us - best_us
            print(f"{name:8s} {rows:4d}: {torch_us:6.1f} | {best_us:6.1f} (#{best_rank} of {len(timed)}) | "
                  f"{first:6.1f}", flush=True)
    for rows in sorted({r for _, r in saved}):
        layer = sum(v for (n, r), v in saved.items() if r == rows)
        print(f"rows {rows}: the best candidates save {layer:.1f} us a layer, {layer * 28 / 1e3:.3f} ms a step")


if __name__ == "__main__":
    main()
