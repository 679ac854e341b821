"""On CUDA: the fp8 paged decode in CUDA (core/kernels/cuda/fp8_decode.py) against float32 attention over the
same fp8 pages, for head dims 64 and 128, query groups of 1 to 8, page sizes 1 and 16, splits, bf16 and float16
queries; the same kernel inside an engine under CUDA graphs against the Triton kernel's tokens. Skipped without
CUDA, or where the kernel cannot build (no nvcc, or a GPU without fp8 conversions)."""

from __future__ import annotations

import pytest
import torch

from core.kernels.cuda.fp8_decode import fp8_decode_cuda, unavailable_reason
from core.kvcache.pool import KVPool
from tests.gpu.test_paged_decode import float_attention

pytestmark = [pytest.mark.gpu]


@pytest.fixture(scope="module", autouse=True)
def needs_the_kernel():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    reason = unavailable_reason(torch.device("cuda"))
    if reason:
        pytest.skip(reason)


def scattered_pool(lengths, page_size, kv_heads, dim, layers=2, k_gain=3.0):
    """A pool of random fp8 keys and values with each request's pages scattered over it; returns the pool, the
    page lists and the CSR tensors the kernel takes."""
    device = torch.device("cuda")
    pages_needed = [-(-n // page_size) for n in lengths]
    pool = KVPool(layers, sum(pages_needed) + 3, page_size, kv_heads, dim, torch.bfloat16, device, fp8=True)
    order = torch.randperm(sum(pages_needed)).tolist()
    pages, start = [], 0
    for count in pages_needed:
        pages.append(order[start:start + count])
        start += count
    slots = torch.arange(pool.num_slots, device=device)
    for layer in range(layers):
        pool.store(layer, slots, torch.randn(pool.num_slots, kv_heads, dim, device=device).bfloat16() * k_gain,
                   torch.randn(pool.num_slots, kv_heads, dim, device=device).bfloat16())
    indptr = torch.tensor([0] + torch.tensor(pages_needed).cumsum(0).tolist(), dtype=torch.int32, device=device)
    indices = torch.tensor([p for own in pages for p in own], dtype=torch.int32, device=device)
    last = torch.tensor([n - (c - 1) * page_size for n, c in zip(lengths, pages_needed)], dtype=torch.int32,
                        device=device)
    return pool, pages, indptr, indices, last


LENGTHS = [1, 15, 16, 17, 64, 300, 1000, 5, 2049]


@pytest.mark.parametrize("splits", [1, 3, 4])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(16, 8, 128), (8, 8, 128), (32, 4, 128), (12, 3, 64), (14, 2, 64)])
def test_cuda_fp8_decode_matches_float_attention(heads, kv_heads, dim, page_size, splits):
    torch.manual_seed(0)
    pool, pages, indptr, indices, last = scattered_pool(LENGTHS, page_size, kv_heads, dim)
    q = torch.randn(len(LENGTHS), heads, dim, device="cuda").bfloat16()
    got = fp8_decode_cuda(q, pool, 1, indptr, indices, last, dim ** -0.5, splits=splits)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    want = float_attention(q, pool, 1, pages, LENGTHS, dim ** -0.5)
    error = (got.float() - want).abs().max().item()
    assert error < 2e-2, error


def test_float16_queries_and_a_given_output_and_partials():
    torch.manual_seed(1)
    lengths = [33, 700, 2]
    pool, pages, indptr, indices, last = scattered_pool(lengths, 16, 8, 128)
    q = torch.randn(len(lengths), 16, 128, device="cuda").half()
    out = torch.full_like(q, float("nan"))
    part_o = torch.empty(len(lengths) * 16 * 2, 128, device="cuda")
    part_lse = torch.empty(len(lengths) * 16 * 2, device="cuda")
    got = fp8_decode_cuda(q, pool, 0, indptr, indices, last, 0.1, out=out, splits=2, part_o=part_o,
                          part_lse=part_lse)
    assert got.data_ptr() == out.data_ptr() and got.dtype == torch.float16
    want = float_attention(q, pool, 0, pages, lengths, 0.1)
    assert (got.float() - want).abs().max().item() < 2e-2


def test_a_request_of_no_pages_reads_as_zeros_and_others_are_unaffected():
    """A padded row of a CUDA-graph batch has no pages: its output is zeros, not NaN, and its neighbours'
    results are what they are alone."""
    torch.manual_seed(2)
    pool, pages, indptr, indices, last = scattered_pool([40, 9], 16, 8, 128)
    padded_indptr = torch.cat([indptr, indptr[-1:]])  # a third request with no pages
    padded_last = torch.cat([last, torch.ones(1, dtype=torch.int32, device="cuda")])
    q = torch.randn(3, 16, 128, device="cuda").bfloat16()
    got = fp8_decode_cuda(q, pool, 0, padded_indptr, indices, padded_last, 0.088)
    alone = fp8_decode_cuda(q[:2], pool, 0, indptr, indices, last, 0.088)
    assert torch.equal(got[:2], alone)
    assert torch.equal(got[2], torch.zeros_like(got[2]))


def test_under_a_cuda_graph_it_reads_the_page_lists_of_each_replay():
    torch.manual_seed(3)
    pool, pages, indptr, indices, last = scattered_pool([100, 600], 16, 8, 128)
    q = torch.randn(2, 16, 128, device="cuda").bfloat16()
    out = torch.empty_like(q)
    lists = [indptr.clone(), indices.clone(), last.clone()]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fp8_decode_cuda(q, pool, 0, *lists, 0.088, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fp8_decode_cuda(q, pool, 0, *lists, 0.088, out=out)
    lists[2].copy_(torch.tensor([5, 3], dtype=torch.int32, device="cuda"))  # shorter last pages
    graph.replay()
    torch.cuda.synchronize()
    lengths = [6 * 16 + 5, 37 * 16 + 3]
    want = float_attention(q, pool, 0, pages, lengths, 0.088)
    assert (out.float() - want).abs().max().item() < 2e-2


def test_fp8_engine_on_the_cuda_decode_stays_near_the_triton_kernels_tokens(monkeypatch):
    """The engine (flashinfer backend, CUDA graphs) with the CUDA fp8 decode against the same engine with the
    Triton paged kernel: greedy tokens part only at near-ties."""
    from core import LLM, SamplingParams
    from core.bench.reference import near_tie_compare

    prompts = [list(range(10 + i, 200 + 3 * i)) for i in range(6)] + [list(range(5, 1300))]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    kw = dict(max_running_req=8, max_seq_len=2048, kv_cache_gb=1.0, page_size=16, kv_dtype="fp8")
    cuda = LLM("random:small-qwen3", **kw)
    assert cuda.engine.plan.fp8_cuda_decode and cuda.engine.attn_backend.cuda_decode
    assert cuda.engine.graphs.decode is not None and "CUDA fp8 decode" in cuda.engine.describe()
    got = [o["token_ids"] for o in cuda.generate(prompts, params)]
    monkeypatch.setenv("MINISGL_DISABLE_CUDA_FP8_DECODE", "1")
    triton = LLM("random:small-qwen3", **kw)
    assert not triton.engine.plan.fp8_cuda_decode
    want = [o["token_ids"] for o in triton.generate(prompts, params)]
    verdict = near_tie_compare(triton, cuda, prompts, want, got)
    assert verdict.ok, verdict.details
    cuda.close()
    triton.close()
