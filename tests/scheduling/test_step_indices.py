"""The step's index vectors: what the host packs is what the device side unpacks, segment by segment."""

from __future__ import annotations

import torch

from core.request import Req, SamplingParams
from core.scheduler.indices import DecodeIndices, PrefillIndices, decode_indices, prefill_indices


def test_prefill_indices_name_every_prompt_token_and_survive_the_round_trip():
    width = 10
    # (row, first position, tokens): row 2 from position 0, row 0 continuing a chunk at position 4
    writes = [(2, 0, [11, 12, 13]), (0, 4, [21, 22])]
    built = prefill_indices(writes, write_index=[23, 6], pool_width=width)
    assert built.token_rows.tolist() == [2, 2, 2, 0, 0]
    assert built.positions.tolist() == [0, 1, 2, 4, 5]
    assert built.input_ids.tolist() == [11, 12, 13, 21, 22]
    assert built.pool_places.tolist() == [20, 21, 22, 4, 5]
    assert built.logits_rows.tolist() == [2, 4]  # each request samples from its last token

    flat, lengths = built.pack()
    assert lengths == (5, 5, 5, 5, 2, 2) and flat.dtype == torch.int64
    back = PrefillIndices.unpack(flat, lengths)
    for name in ("token_rows", "positions", "input_ids", "pool_places", "write_index", "logits_rows"):
        assert torch.equal(torch.as_tensor(getattr(built, name)), getattr(back, name)), name


def test_decode_indices_read_kv_slots_off_the_page_list_and_pad_to_the_graph_size():
    page_size, width = 4, 9
    params = SamplingParams(max_tokens=8)
    # uid 1: 6 tokens known, the new one at position 5 on its second page (7); uid 2: position 2 on page 3
    reqs = [Req(1, [0] * 6, 3, table_idx=1, cached_len=5, device_len=6, max_device_len=11, params=params,
                sample_seed=0, pages=[9, 7]),
            Req(2, [0] * 3, 3, table_idx=0, cached_len=2, device_len=3, max_device_len=11, params=params,
                sample_seed=0, pages=[3])]
    built = decode_indices(reqs, write_index=[15, 3], pad=1, page_size=page_size, pool_width=width, pad_row=4,
                           dummy_page=0)
    back = DecodeIndices.unpack(*built.pack())
    assert back.input_places.tolist() == [1 * width + 5, 0 * width + 2, 4 * width]
    assert back.positions.tolist() == [5, 2, 0]
    assert back.out_loc.tolist() == [7 * page_size + 1, 3 * page_size + 2, 0]
    assert back.write_index.tolist() == [15, 3]
    assert back.logits_rows.tolist() == [0, 1]
