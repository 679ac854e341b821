"""The Triton kernels behind core/kernels/race.py (see there for what they do and why).

A module of its own because it imports triton at the top; the rest of the engine imports without triton.
"""

import triton
import triton.language as tl


@triton.jit
def _mix(x, MASK: tl.constexpr, MIX: tl.constexpr):
    """race.mix on uint32 values below 2**31: each product modulo 2**32, then its low 31 bits."""
    x = ((x ^ (x >> 16)) * MIX) & MASK
    x = ((x ^ (x >> 16)) * MIX) & MASK
    return x ^ (x >> 16)


@triton.jit
def _row_key(seeds_ptr, positions_ptr, row, MASK: tl.constexpr, MIX: tl.constexpr):
    """race.row_keys for one row: the int64 seed folded to 31 bits (an arithmetic shift, as torch's), mixed
    twice, then mixed with the position's low 31 bits."""
    seed = tl.load(seeds_ptr + row)
    folded = ((seed ^ (seed >> 31)) & MASK).to(tl.uint32)
    position = (tl.load(positions_ptr + row) & MASK).to(tl.uint32)
    return _mix(_mix(folded, MASK, MIX) ^ position, MASK, MIX)


@triton.jit
def race_chunks_kernel(logits_ptr, row_stride, temperatures_ptr, seeds_ptr, positions_ptr, vocab, part_max_ptr,
                       part_col_ptr, chunks, BLOCK: tl.constexpr, MASK: tl.constexpr, MIX: tl.constexpr,
                       COLUMN: tl.constexpr):
    """One program per (row, chunk of BLOCK columns): the chunk's largest score and its first column. Each
    program derives its row's key itself (a few scalar operations), so no kernel before it computes the keys."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    valid = cols < vocab
    logit = tl.load(logits_ptr + row.to(tl.int64) * row_stride + cols, mask=valid, other=0.0).to(tl.float32)
    temperature = tl.load(temperatures_ptr + row)
    key = _row_key(seeds_ptr, positions_ptr, row, MASK, MIX)
    spread = (cols.to(tl.uint32) * COLUMN) & MASK
    bits = _mix((key ^ spread) & MASK, MASK, MIX) >> 7
    uniform = (bits.to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    score = tl.math.div_rn(logit, temperature) - tl.log(-tl.log(uniform))
    score = tl.where(valid, score, float("-inf"))
    best = tl.argmax(score, 0, tie_break_left=True)
    out = row * chunks + chunk
    tl.store(part_max_ptr + out, tl.max(score, 0))
    tl.store(part_col_ptr + out, (chunk * BLOCK + best).to(tl.int64))


@triton.jit
def argmax_chunks_kernel(logits_ptr, row_stride, vocab, part_max_ptr, part_col_ptr, chunks, BLOCK: tl.constexpr):
    """The greedy pick's first stage, race_chunks_kernel without the noise: a chunk's largest logit and its
    first column."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    valid = cols < vocab
    logit = tl.load(logits_ptr + row.to(tl.int64) * row_stride + cols, mask=valid, other=float("-inf"))
    logit = logit.to(tl.float32)
    best = tl.argmax(logit, 0, tie_break_left=True)
    out = row * chunks + chunk
    tl.store(part_max_ptr + out, tl.max(logit, 0))
    tl.store(part_col_ptr + out, (chunk * BLOCK + best).to(tl.int64))


@triton.jit
def race_pick_kernel(part_max_ptr, part_col_ptr, tokens_ptr, chunks, BLOCK_C: tl.constexpr):
    """One program per row: the first chunk holding the row's largest score gives the token."""
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK_C)
    scores = tl.load(part_max_ptr + row * chunks + c, mask=c < chunks, other=float("-inf"))
    best = tl.argmax(scores, 0, tie_break_left=True)
    tl.store(tokens_ptr + row, tl.load(part_col_ptr + row * chunks + best))
