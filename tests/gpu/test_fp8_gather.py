"""On CUDA: the fp8 gather's one Triton launch (core/kernels/cuda/fp8_gather.py) returns KVPool.gather's keys and
values bit for bit, for scattered, repeated and no slots, in bf16 and float16 and at a head size off the powers
of two. (That an fp8 engine's prefill takes it is the plan's test, tests/engine/test_engine_plan.py.)"""

from __future__ import annotations

import pytest
import torch

from core.kernels.cuda.fp8_gather import fp8_gather
from core.kernels.cuda.triton_available import triton_runs_on
from core.kvcache.pool import KVPool

pytestmark = [pytest.mark.gpu]


@pytest.fixture(scope="module", autouse=True)
def needs_triton_on_cuda():
    if not torch.cuda.is_available() or not triton_runs_on(torch.device("cuda")):
        pytest.skip("needs CUDA and Triton")


@pytest.mark.parametrize("kv_heads, dim, dtype", [(8, 128, torch.bfloat16), (2, 64, torch.float16),
                                                  (3, 80, torch.bfloat16)])
def test_it_returns_the_pools_own_gather_bit_for_bit(kv_heads, dim, dtype):
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(kv_heads * dim)
    pool = KVPool(2, 64, 4, kv_heads, dim, dtype, device, fp8=True)
    slots = torch.arange(pool.num_slots, device=device)
    for layer in range(2):
        pool.store(layer, slots, 3 * torch.randn(len(slots), kv_heads, dim, device=device, generator=gen).to(dtype),
                   torch.randn(len(slots), kv_heads, dim, device=device, generator=gen).to(dtype))
    picked = torch.tensor([5, 200, 5, 0, 255, 17, 18, 19], device=device)
    for layer in range(2):
        for chosen in (picked, picked[:1], picked[:0]):
            ours, theirs = fp8_gather(pool, layer, chosen, dtype), pool.gather(layer, chosen, dtype)
            for a, b in zip(ours, theirs):
                assert a.dtype == dtype and a.shape == b.shape and torch.equal(a, b)
