"""A scheduled batch made ready to run: its pages, then every index the step needs, sent to the device in one
upload (core/scheduler/indices.py), and the attention backend's metadata built from them."""

from __future__ import annotations

import torch

from core.engine.engine import Engine
from core.request import Batch
from core.scheduler.cache import CacheManager
from core.scheduler.indices import DecodeIndices, PrefillIndices, decode_indices, prefill_indices
from core.scheduler.table import TableManager
from core.transfer import upload


def prepare_batch(batch: Batch, writes: list[tuple[int, int, list[int]]], engine: Engine, table: TableManager,
                  cache: CacheManager, page_size: int, device: torch.device) -> tuple[DecodeIndices | PrefillIndices,
                                                                                     torch.Tensor | None, list[bool]]:
    """Give ``batch`` its pages, positions, KV slots and (prefill) input tokens on the device; ``writes``: the
    prefill's prompt tokens by row (the prefill manager's). Returns the uploaded indices, where a decode step's
    inputs lie in the token pool (None for prefill: the host has them) and which requests sample a token (not a
    chunk of a prompt that goes on)."""
    cache.allocate(batch.reqs)
    reqs = batch.reqs
    samples = [not r.is_chunked for r in reqs]
    write_index = [r.table_idx * table.width + (r.device_len if s else table.scratch_col)
                   for r, s in zip(reqs, samples)]
    input_index = None
    batch.padded_size = engine.padded_size(batch)
    if batch.is_prefill:
        host, lengths = prefill_indices(writes, write_index, table.width).pack()
        dev = PrefillIndices.unpack(upload(host, device), lengths)
        # a prefill's inputs are prompt tokens: the host has them; the pool keeps a copy
        batch.positions, batch.input_ids = dev.positions, dev.input_ids
        table.flat[dev.pool_places] = batch.input_ids
        batch.out_loc = engine.page_table[dev.token_rows, batch.positions]
    else:
        host, lengths = decode_indices(reqs, write_index, batch.padded_size - len(reqs), page_size,
                                       table.width, table.pad_row, engine.dummy_page).pack()
        dev = DecodeIndices.unpack(upload(host, device), lengths)
        input_index, batch.positions, batch.out_loc = dev.input_places, dev.positions, dev.out_loc
    engine.attn_backend.prepare_metadata(batch)
    return dev, input_index, samples
