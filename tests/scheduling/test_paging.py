"""Page lists for paged kernels, read from the page table, equal each request's own list of pages."""

from __future__ import annotations

import pytest
import torch

from core.kernels.cuda.attention.paging import packed_page_lists, paged_layout
from core.kernels.cuda.graphs.decode import adjacent_span, batch_size_ladder
from core.request import Req, SamplingParams
from core.scheduler.cache import CacheManager


def _req(uid: int, row: int, length: int) -> Req:
    return Req(uid=uid, input_ids=list(range(length)), prompt_len=length, table_idx=row, cached_len=0,
               device_len=length, max_device_len=length + 8, params=SamplingParams(), sample_seed=0)


@pytest.mark.parametrize("from_host", [False, True])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_layout_matches_each_requests_pages(page_size, from_host):
    table = torch.zeros(5, 64, dtype=torch.int64)
    cache = CacheManager(num_pages=64, page_size=page_size, page_table=table, cache_type="naive")
    cache._free_pages.reverse()  # pages out of order, so a wrong gather cannot pass by accident
    reqs = [_req(0, 2, 5), _req(1, 0, 16), _req(2, 3, 1), _req(3, 1, 33)]
    cache.allocate(reqs)
    for req in reqs:  # one more token each, as a decode step would
        req.device_len += 1
    cache.allocate(reqs)
    layout = paged_layout(table, [r.table_idx for r in reqs], [r.device_len for r in reqs], page_size,
                          [r.pages for r in reqs] if from_host else None)
    expected_pages, indptr, last = [], [0], []
    for req in reqs:
        n = -(-req.device_len // page_size)
        expected_pages += req.pages[:n]
        indptr.append(indptr[-1] + n)
        last.append(req.device_len - (n - 1) * page_size)
    assert layout.indices.tolist() == expected_pages
    assert layout.indptr.tolist() == indptr
    assert layout.last_page_len.tolist() == last
    assert layout.indices.dtype == layout.indptr.dtype == torch.int32


def test_graph_ladder_covers_every_size_up_to_the_cap():
    assert batch_size_ladder(1) == [1]
    assert batch_size_ladder(20) == [1, 2, 4, 8, 16, 20]
    ladder = batch_size_ladder(256)
    assert ladder[:5] == [1, 2, 4, 8, 16] and ladder[-1] == 256
    assert all(b - a <= 8 for a, b in zip(ladder, ladder[1:]))


def test_layout_reads_the_page_table_when_a_request_holds_no_page_list():
    table = torch.arange(2 * 64).view(2, 64)  # row r, position p -> slot 64 r + p
    layout = paged_layout(table, [1, 0], [9, 4], 4, pages=[[], []])
    assert layout.indices.tolist() == [16, 17, 18, 0]


@pytest.mark.parametrize("pad", [0, 2])
def test_packed_page_lists_hold_the_layout_with_its_padding_rows(pad):
    """The small decode's one-copy page lists: the same indptr, last lengths and pages as paged_layout gives
    (padded the way a CUDA-graph batch is), at fixed offsets whatever the batch size."""
    table = torch.arange(2 * 64).view(2, 64)  # row r, position p -> slot 64 r + p
    pages = [[5, 9, 2], [7]]
    lens = [9, 4]
    layout = paged_layout(table, [0, 1], lens, 4, pages).padded(pad, 30)
    header = 8
    packed = packed_page_lists(pages, lens, 4, pad, 30, header)
    assert packed.dtype == torch.int32
    rows = len(lens) + pad
    assert packed[:rows + 1].tolist() == layout.indptr.tolist()
    assert packed[header:header + rows].tolist() == layout.last_page_len.tolist()
    assert packed[2 * header:].tolist() == layout.indices.tolist() == [5, 9, 2, 7] + [30] * pad


def test_packed_page_lists_give_way_when_a_list_is_missing_or_the_batch_too_big():
    assert packed_page_lists([[1], []], [3, 3], 4, 0, 30, 8) is None  # the second request's list not filled in
    assert packed_page_lists([[1]] * 4, [3] * 4, 4, 4, 30, 8) is None  # 8 rows need 9 offsets


def test_adjacent_span_joins_consecutive_pieces_of_one_upload_only():
    flat = torch.arange(10)
    a, b, c = torch.split(flat, [3, 3, 4])
    assert adjacent_span(a, b).tolist() == [0, 1, 2, 3, 4, 5]
    assert adjacent_span(b, a) is None  # wrong order
    assert adjacent_span(b, c) is None  # lengths differ
    assert adjacent_span(a, torch.arange(3, 6)) is None  # another buffer
