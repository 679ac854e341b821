"""Page lists for paged kernels, read from the page table, equal each request's own list of pages."""

from __future__ import annotations

import pytest
import torch

from core.attention.paging import paged_layout
from core.engine.graph import batch_size_ladder
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
