"""Would two half-batches on two streams beat one batch on one? A probe of a decode step's shape on CUDA.

A decode step at 129-256 rows spends about three quarters of its time in attention, which is bound by reading
the KV cache, and most of the rest in the four linears a layer, which are bound by their kernels' ramp and too few
tiles for the SMs, not by bandwidth. Cut the batch in two and run each half's layers on its own stream: while one
half reads its KV, the other's linears could run on the SMs attention leaves idle. The cost: each half reads the
weights again (0.27 ms a step at the copy rate) and its linears have half the rows.

This times, as CUDA graphs of 28 layers (the Qwen3-0.6B shapes: QKV, attention on flashinfer's unsplit tensor-core
decode over the workload's own contexts at that batch size, o_proj, gate_up, SiLU-and-mul, down; each layer its own
weights so they come from HBM; no norms, RoPE or LM head):

* ``one batch``: the whole batch on one stream (what the engine does);
* ``halves, one stream``: the two halves one after the other (the split's cost with no overlap);
* ``halves, two streams``: each half on its own stream, the second starting after the first's first linear
  (also with the second's stream at a higher priority, so its blocks go first when both wait for SMs).

    . scripts/gpu_env.sh && python3 scripts/gpu_overlap_probe.py [--batches 128,192,256] [--repeats 5]
"""

from __future__ import annotations

import argparse
from typing import Callable

import torch
import torch.nn.functional as F

# beside this script: Python puts a script's folder on its path
from gpu_decode_mixed import DIM, HEADS, KV_HEADS, PAGE, WORKSPACE_BYTES, contexts_at, workload_lengths

LAYERS, HIDDEN, INTER = 28, 1024, 3072


class Half:
    """One part of the batch: its page lists, a flashinfer wrapper planned for them (with its own workspace, so
    two halves can run at once) and its activations."""

    def __init__(self, contexts: list[int], first_page: int, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        import flashinfer

        device = kv[0].device
        pages = [-(-c // PAGE) for c in contexts]
        indptr = torch.tensor([0] + pages).cumsum(0).to(torch.int32)
        indices = torch.arange(first_page, first_page + int(indptr[-1]), dtype=torch.int32)
        last = torch.tensor([c - (p - 1) * PAGE for c, p in zip(contexts, pages)], dtype=torch.int32)
        self.pages_used = int(indptr[-1])
        self.rows = len(contexts)
        self.kv = kv
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device), "NHD", use_cuda_graph=True,
            use_tensor_cores=True, paged_kv_indptr_buffer=indptr.to(device),
            paged_kv_indices_buffer=indices.to(device), paged_kv_last_page_len_buffer=last.to(device))
        self.wrapper.plan(indptr, indices, last, HEADS, KV_HEADS, DIM, PAGE, sm_scale=DIM ** -0.5,
                          q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, disable_split_kv=True)
        self.x = torch.randn(self.rows, HIDDEN, device=device, dtype=torch.bfloat16)
        self.q = torch.randn(self.rows, HEADS, DIM, device=device, dtype=torch.bfloat16)
        self.attn_out = torch.empty_like(self.q)

    def layer(self, weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        F.linear(x, weights["qkv"])  # its output would become q after QK-norm and RoPE; q stays fixed here
        self.wrapper.run(self.q, self.kv, out=self.attn_out)
        x = F.linear(self.attn_out.view(self.rows, HEADS * DIM), weights["o"])
        gate, up = F.linear(x, weights["gate_up"]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, weights["down"])


def step_ms(launch: Callable[[], None], repeats: int) -> float:
    """Median milliseconds of one captured step."""
    launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def probe(contexts: list[int], layers: list[dict[str, torch.Tensor]], repeats: int) -> dict[str, float]:
    device = layers[0]["qkv"].device
    total_pages = sum(-(-c // PAGE) for c in contexts) * 2 + 1  # the whole batch's pages, then the halves'
    k = torch.randn(total_pages, PAGE, KV_HEADS, DIM, device=device, dtype=torch.bfloat16)
    kv = (k, torch.randn_like(k))
    whole = Half(contexts, 0, kv)
    cut = len(contexts) // 2
    first = Half(contexts[:cut], whole.pages_used, kv)
    second = Half(contexts[cut:], whole.pages_used + first.pages_used, kv)

    def chain(half: Half) -> None:
        x = half.x
        for weights in layers:
            x = half.layer(weights, x)

    def two_streams(priority: int = 0) -> None:
        side = torch.cuda.Stream(priority=priority)
        started = torch.cuda.Event()
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        F.linear(first.x, layers[0]["qkv"])  # the first half's first linear, then the second half may start
        started.record()
        with torch.cuda.stream(side):
            side.wait_event(started)
            chain(second)
        chain(first)
        main.wait_stream(side)

    def halves_one_stream() -> None:
        chain(first)
        chain(second)

    return {"one batch": step_ms(lambda: chain(whole), repeats),
            "halves, one stream": step_ms(halves_one_stream, repeats),
            "halves, two streams": step_ms(two_streams, repeats),
            "halves, two streams, the second first in line": step_ms(lambda: two_streams(-1), repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="128,192,256")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    shapes = {"qkv": (HEADS * DIM + 2 * KV_HEADS * DIM, HIDDEN), "o": (HIDDEN, HEADS * DIM),
              "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
    layers = [{name: torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02
               for name, shape in shapes.items()} for _ in range(LAYERS)]
    prompt_lens, max_tokens = workload_lengths()
    for batch in (int(b) for b in args.batches.split(",")):
        contexts = contexts_at(batch, prompt_lens, max_tokens)
        got = probe(contexts, layers, args.repeats)
        base = got["one batch"]
        print(f"rows {batch} (context mean {sum(contexts) / batch:.0f}): " + ", ".join(
            f"{name} {ms:.3f} ms ({base / ms:.2f}x)" for name, ms in got.items()), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
