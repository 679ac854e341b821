"""The screened LM head's kernels against the plain GEMV, each inside a CUDA graph (8 calls a graph, medians of 15
replays, two head copies alternated so reads come from memory): the estimate's tiles, the whole screen's gate
group, the plain GEMV, and the greedy pick on Triton against torch's argmax. Qwen3-0.6B's head, random weights.

    . scripts/gpu_env.sh && python3 scripts/gpu_screened_head.py
"""

import torch

import core.kernels.gpu_screened_head as screen
from core.arith import ceil_div
from core.kernels.gemv import gemv
from core.kernels.gpu_screened_head import GpuScreenedHead, _kernels, error_bounds
from core.kernels.race import greedy_tokens
from gpu_profile import graph_time_us  # scripts/, on the path when run as a script

V, K = 151936, 1024


def graph_us(fn, calls: int = 8) -> float:
    return graph_time_us(fn, calls, repeats=15)


def main() -> None:
    torch.manual_seed(0)
    heads = [GpuScreenedHead.of((torch.randn(V, K, device="cuda") * K ** -0.5).bfloat16()) for _ in range(2)]
    h = torch.randn(1, K, device="cuda").bfloat16()
    estimate, _ = _kernels()
    error_per_l1, rel = error_bounds(K, torch.bfloat16)
    for block_v, warps, chunk in [(16, 4, 1024), (16, 4, 256), (16, 4, 128), (16, 8, 256), (32, 4, 256),
                                  (32, 8, 256), (64, 8, 128), (8, 2, 256), (32, 4, 128), (64, 4, 128)]:
        def run(i, block_v=block_v, warps=warps, chunk=chunk):
            head = heads[i % 2]
            estimate[(ceil_div(V, block_v),)](h, head.values, head.scales, head.upper, head.best, V, error_per_l1,
                                              rel, K=K, BLOCK_V=block_v, BLOCK_K=K, SLOTS=screen.BEST_SLOTS,
                                              CHUNK=chunk, num_warps=warps)
        print(f"estimate, {block_v} rows a program, {warps} warps, chunks of {chunk}: {graph_us(run):.1f} us",
              flush=True)
    for group in (16, 32):
        screen.GATE_GROUP = group
        print(f"whole screen, gate group {group}: {graph_us(lambda i: heads[i % 2].logits(h)):.1f} us", flush=True)
    print(f"plain GEMV head: {graph_us(lambda i: gemv(h, heads[i % 2].weight)):.1f} us")
    for rows in (1, 256):
        logits = torch.randn(rows, V, device="cuda").bfloat16()
        print(f"{rows} rows: greedy_tokens {graph_us(lambda i: greedy_tokens(logits)):.1f} us, torch argmax "
              f"{graph_us(lambda i: logits.argmax(-1)):.1f} us")


if __name__ == "__main__":
    main()
