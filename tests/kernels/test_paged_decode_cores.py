"""The paged decode's CUDA-core variant (``DecodeTile.cuda_cores``: the group's real rows multiplied on the CUDA
cores, no 16-row padding) gives float32 attention over the same pages, fp8 and plain, also with its tokens
split over several programs.

It runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed); it is
skipped elsewhere. The cases are tests/kernels/test_paged_decode_rows.py's scattered pages.
"""

from __future__ import annotations

import pytest
import torch

from core.kernels.paged_decode import DecodeTile, SplitBuffers, paged_decode
from core.kernels.triton_available import triton_runs_on
from tests.gpu.test_paged_decode import float_attention
from tests.kernels.test_paged_decode_rows import DEVICE, LENGTHS, close, scattered_case

pytestmark = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                reason="needs triton on CUDA, or TRITON_INTERPRET=1 on a CPU")


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "fp8"])
@pytest.mark.parametrize("shape", [(4, 2, 16, 4), (6, 2, 32, 1), (9, 3, 16, 2), (8, 8, 16, 4)],
                         ids=["group2-d16-p4", "group3-d32-p1", "group3-d16-p2", "group1-d16-p4"])
@pytest.mark.parametrize("defer_sum", [False, True], ids=["sum", "deferred"])
def test_cuda_cores_match_float_attention(shape, fp8, q_dtype, splits, defer_sum):
    heads, kv_heads, dim, page_size = shape
    pool, q, pages, indptr, indices, last = scattered_case(heads, kv_heads, dim, page_size, fp8, q_dtype)
    tile = DecodeTile(8, 1, 1, splits=splits, cuda_cores=True, defer_sum=defer_sum)
    buffers = SplitBuffers.make(len(LENGTHS), heads, kv_heads, dim, 4, q.device)
    got = paged_decode(q, pool, 0, indptr, indices, last, dim ** -0.5, tile=tile, split_buffers=buffers)
    want = float_attention(q, pool, 0, pages, LENGTHS, dim ** -0.5)
    assert got.dtype == q_dtype and got.shape == q.shape
    assert close(got, want)
    assert not buffers.counters.any()  # the merging programs reset their counters for the next layer
