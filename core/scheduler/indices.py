"""The int64 vectors one step sends to the device (positions, KV slots, token-pool places, ...), packed into one
upload instead of a copy apiece. The host packs a ``PrefillIndices`` or ``DecodeIndices``; the device side
unpacks the upload into the same class. Both follow the class's field order and the lengths ``pack`` recorded,
so the producer and the consumer cannot disagree about where a segment starts.

The host builds them with numpy, not torch: a torch CPU op on a few thousand elements may wake torch's pool of
threads, which costs far more than the op (milliseconds where a thread of the pool is not running), and a
prefill step's host work is on every stream's path (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from itertools import chain
from typing import TypeVar

import numpy as np
import torch

from core.request import Req
from core.transfer import host_tensor

Ints = np.ndarray | list[int]  # a host vector: an int64 array, or a list when built per request in Python
P = TypeVar("P", bound="PackedIndices")


@dataclass
class PackedIndices:
    """Named int64 vectors that cross to the device as one tensor (subclasses name the segments)."""

    def pack(self) -> tuple[torch.Tensor, tuple[int, ...]]:
        """One flat host tensor of every field, in field order, and each field's length."""
        parts = [getattr(self, f.name) for f in dataclasses.fields(self)]
        lengths = tuple(len(p) for p in parts)
        if all(isinstance(p, list) for p in parts):  # one tensor from one list: cheaper than a cat of small ones
            return host_tensor(list(chain.from_iterable(parts)), torch.int64), lengths
        return torch.from_numpy(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])), lengths

    @classmethod
    def unpack(cls: type[P], flat: torch.Tensor, lengths: tuple[int, ...]) -> P:
        """The fields again, as views of ``flat`` (the uploaded copy of what ``pack`` returned)."""
        return cls(*torch.split(flat, lengths))


@dataclass
class PrefillIndices(PackedIndices):
    token_rows: Ints  # each prompt token's page-table row
    positions: Ints  # each prompt token's position
    input_ids: Ints  # the prompt tokens themselves (the host has them)
    pool_places: Ints  # where each prompt token is kept in the flat token pool
    write_index: Ints  # per request: where its sampled token goes in the flat token pool
    logits_rows: Ints  # per request: the hidden-state row it samples from (its last token)


@dataclass
class DecodeIndices(PackedIndices):
    input_places: Ints  # each input token's place in the flat token pool (the previous step wrote it there)
    positions: Ints
    out_loc: Ints  # each input token's KV slot
    write_index: Ints
    logits_rows: Ints


def prefill_indices(writes: list[tuple[int, int, list[int]]], write_index: list[int],
                    pool_width: int) -> PrefillIndices:
    """``writes`` holds (row, first position, tokens) per request; built with a few array ops rather than a
    Python loop over every token."""
    lengths = np.array([len(tokens) for _, _, tokens in writes], dtype=np.int64)
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    rows = np.array([row for row, _, _ in writes], dtype=np.int64)
    starts = np.array([start for _, start, _ in writes], dtype=np.int64)
    token_rows = np.repeat(rows, lengths)
    positions = np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)
    values = np.fromiter(chain.from_iterable(tokens for _, _, tokens in writes), dtype=np.int64, count=total)
    return PrefillIndices(token_rows, positions, values, token_rows * pool_width + positions,
                          np.array(write_index, dtype=np.int64), ends - 1)


def decode_indices(reqs: list[Req], write_index: list[int], pad: int, page_size: int, pool_width: int,
                   pad_row: int, dummy_page: int) -> DecodeIndices:
    """One token per request, so the KV slot is read off the request's page list here instead of gathered from
    the page table on the device. Under CUDA graphs, ``pad`` padding rows read the spare row at position 0 and
    write the dummy page."""
    positions = [r.cached_len for r in reqs]  # the new token's position: device_len - 1
    slots = [r.pages[p // page_size] * page_size + p % page_size for r, p in zip(reqs, positions)]
    inputs = [r.table_idx * pool_width + p for r, p in zip(reqs, positions)]
    return DecodeIndices(inputs + [pad_row * pool_width] * pad, positions + [0] * pad,
                         slots + [dummy_page * page_size] * pad, write_index, list(range(len(reqs))))
