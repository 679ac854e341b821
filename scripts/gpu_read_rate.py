"""How fast can this GPU read memory, as against copy it? The ceiling a bandwidth-bound kernel (decode attention)
is held to.

docs/BENCHMARKS.md measures decode attention against the copy rate (``minisgl bench``'s: a tensor copied, bytes
read plus bytes written over the time). A decode kernel only reads, and reads can stream faster than a copy's mix
of reads and writes; if they do, attention at 93% of the copy rate is further from its ceiling than that says.
This times, over a 4 GiB bf16 tensor: a copy (read + write), a full sum (read only, one float32 accumulator per
block) and a row-wise max over 4 KB rows (read only, many small outputs), in TB/s.

    . scripts/gpu_env.sh && python3 scripts/gpu_read_rate.py
"""

from __future__ import annotations

from typing import Callable

import torch

GIB = 1 << 30


def seconds(fn: Callable[[], object], repeats: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def main() -> None:
    x = torch.empty(4 * GIB // 2, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    size = x.numel() * x.element_size()
    rows = x.view(-1, 2048)  # 4 KB rows: a page of one KV head is 16 rows of 256 B, a token's K and V 4 KB
    for _ in range(2):
        print(f"copy {2 * size / seconds(lambda: y.copy_(x)) / 1e12:.2f} TB/s (read + write), "
              f"sum {size / seconds(lambda: x.sum(dtype=torch.float32)) / 1e12:.2f} TB/s (read), "
              f"row max {size / seconds(lambda: rows.amax(dim=1)) / 1e12:.2f} TB/s (read)", flush=True)


if __name__ == "__main__":
    main()
