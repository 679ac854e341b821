"""The exponential race (core/engine/sampler.py) as two Triton kernels: temperature draws without torch.compile.

A sampled step's draw reads every logit once: ``argmax(l / T - log(-log u))`` with ``u`` a hash of (the row's
key, the column). torch.compile fuses it into one reduction per row, so 256 rows of a 152K vocabulary keep only
256 programs busy, several times the greedy argmax's time. Here the vocabulary is cut into chunks:
one program per (row, chunk) computes its chunk's scores and best column, a second kernel picks each row's best
chunk (the first on ties, so the first maximal column wins, as ``argmax`` says). The hash is the sampler's, with
the same 31-bit values: its products are taken modulo 2**32 in uint32, whose low 31 bits are the int64 product's.

The hash itself lives below both (core/kernels/sampling.py); ``TRITON_SAMPLING`` is what this wing hands the
sampler where the engine's plan chose these kernels. Their first kernel derives each row's key itself from the
seed and the position: in torch the keys were 25 kernels of a microsecond or two each, on every sampled step.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch

from core.arith import next_pow2
from core.kernels.sampling import COLUMN_MULTIPLIER, MASK31, MIX_MULTIPLIER, SamplingKernels

BLOCK = 2048  # columns per program
# a race program's warps: two where the rows are many (programs enough to fill the device), four where they are
# few (each program's arithmetic is then the step's length); docs/BENCHMARKS.md
FEW_WARPS_FROM_ROWS = 64


class RaceKernels(NamedTuple):
    race_chunks: Any  # the race's first stage: each chunk's best noisy score and its column
    argmax_chunks: Any  # the greedy pick's first stage: each chunk's largest logit and its column
    pick: Any  # both second stages: each row's first best chunk


@functools.cache
def _kernels() -> RaceKernels:
    from core.kernels.cuda.race_triton import argmax_chunks_kernel, race_chunks_kernel, race_pick_kernel  # imports triton

    return RaceKernels(race_chunks_kernel, argmax_chunks_kernel, race_pick_kernel)


def race_tokens(logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor,
                positions: torch.Tensor, bits: torch.Tensor | None = None, block: int = BLOCK,
                num_warps: int | None = None, screen: bool = True) -> torch.Tensor:
    """The sampler's ``_race`` (same arguments, [rows] int64 tokens) on the Triton kernels; with ``bits`` (a
    grammar's token masks, one row each: core/constrain/masks.py) the race over ``apply_masks``'s logits, read
    in place. ``block`` (columns a program), ``num_warps`` (a program's warps; by default by the row count) and
    ``screen`` (each chunk's best found on cheap scores first, then made exact; race_chunks_kernel says why that
    is the same) change the time, never the tokens."""
    chunks_kernel = _kernels().race_chunks
    if num_warps is None:
        num_warps = 2 if logits.shape[0] >= FEW_WARPS_FROM_ROWS else 4
    # the kernel derives each row's key from these (row_keys in torch was 25 small kernels a step)
    seeds, positions = seeds.to(torch.int64).contiguous(), positions.to(torch.int64).contiguous()
    masks, masks_stride = _masks(bits, logits)

    def chunks(logits, parts, part_max, part_col) -> None:
        chunks_kernel[(logits.shape[0], parts)](logits, logits.stride(0), temperatures.to(torch.float32).contiguous(),
                                                seeds, positions, logits.shape[1], part_max, part_col, parts, masks,
                                                masks_stride, BLOCK=block, MASK=MASK31, MIX=MIX_MULTIPLIER,
                                                COLUMN=COLUMN_MULTIPLIER, SCREEN=screen,
                                                HARDWARE_LOG=logits.is_cuda, MASKED=bits is not None,
                                                num_warps=num_warps)

    return _two_stages(logits, chunks, block)


def greedy_tokens(logits: torch.Tensor, bits: torch.Tensor | None = None) -> torch.Tensor:
    """``logits.argmax(-1)`` ([rows] int64, the first maximal column) on the same two-stage Triton kernels, without
    the noise: one row of a 152K vocabulary is 76 programs instead of torch's one reduction. ``bits``: as for
    ``race_tokens``."""
    chunks_kernel = _kernels().argmax_chunks
    masks, masks_stride = _masks(bits, logits)

    def chunks(logits, parts, part_max, part_col) -> None:
        chunks_kernel[(logits.shape[0], parts)](logits, logits.stride(0), logits.shape[1], part_max, part_col, parts,
                                                masks, masks_stride, BLOCK=BLOCK, MASKED=bits is not None,
                                                num_warps=4)

    return _two_stages(logits, chunks)


def _masks(bits: torch.Tensor | None, logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The masks and their row stride as the kernels take them; without masks, the logits in their place (never
    read: the kernels compiled unmasked skip them)."""
    if bits is None:
        return logits, 0
    bits = bits.contiguous()
    return bits, bits.stride(0)


def _two_stages(logits: torch.Tensor, chunks, block: int = BLOCK) -> torch.Tensor:
    """[rows] int64 tokens: ``chunks(logits, parts, part_max, part_col)`` launches the first stage (each chunk's
    best score and column), then the pick takes each row's first best chunk."""
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    rows, vocab = logits.shape
    parts = -(-vocab // block)
    part_max = torch.empty(rows, parts, dtype=torch.float32, device=logits.device)
    part_col = torch.empty(rows, parts, dtype=torch.int64, device=logits.device)
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return tokens
    chunks(logits, parts, part_max, part_col)
    _kernels().pick[(rows,)](part_max, part_col, tokens, parts, BLOCK_C=next_pow2(parts))
    return tokens


# the wing's race and greedy pick for the sampler, which read a grammar's masks themselves; a batch of one, of two
# or more, and of many rows (fewer warps) each compile their own code
TRITON_SAMPLING = SamplingKernels(race_tokens, greedy_tokens, (1, 2, FEW_WARPS_FROM_ROWS), reads_masks=True)
