"""The Triton kernels behind core/kernels/cuda/race.py (see there for what they do and why).

A module of its own because it imports triton at the top; the rest of the engine imports without triton.
"""

import triton
import triton.language as tl


@triton.jit
def _mix(x, MASK: tl.constexpr, MIX: tl.constexpr):
    """sampling.mix on uint32 values below 2**31: each product modulo 2**32, then its low 31 bits."""
    x = ((x ^ (x >> 16)) * MIX) & MASK
    x = ((x ^ (x >> 16)) * MIX) & MASK
    return x ^ (x >> 16)


@triton.jit
def _row_key(seeds_ptr, positions_ptr, row, MASK: tl.constexpr, MIX: tl.constexpr):
    """sampling.row_keys for one row: the int64 seed folded to 31 bits (an arithmetic shift, as torch's), mixed
    twice, then mixed with the position's low 31 bits."""
    seed = tl.load(seeds_ptr + row)
    folded = ((seed ^ (seed >> 31)) & MASK).to(tl.uint32)
    position = (tl.load(positions_ptr + row) & MASK).to(tl.uint32)
    return _mix(_mix(folded, MASK, MIX) ^ position, MASK, MIX)


@triton.jit
def _uniform(key, cols, MASK: tl.constexpr, MIX: tl.constexpr, COLUMN: tl.constexpr):
    """race.hashed_uniform for one row's key at columns ``cols`` (a block, or one column)."""
    spread = (cols.to(tl.uint32) * COLUMN) & MASK
    bits = _mix((key ^ spread) & MASK, MASK, MIX) >> 7
    return tl.minimum((bits.to(tl.float32) + 0.5) * (1.0 / 16777216.0), 1.0 - 1.0 / 16777216.0)


@triton.jit
def _approx_log(x, HARDWARE_LOG: tl.constexpr):
    """log(x) through the hardware's base-2 logarithm (one instruction, absolute error about 1e-7), or tl.log where
    that instruction is not there (Triton's interpreter, which the CPU tests use)."""
    if HARDWARE_LOG:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1) * 0.6931471805599453
    else:
        return tl.log(x)


@triton.jit
def _approx_noise(uniform, HARDWARE_LOG: tl.constexpr):
    """log(-log(u)), the race's noise with its sign turned, to within about 2e-5. -log(u) is small where u is near
    1, and there the hardware's logarithm has no relative precision: below 1 - u = 0.01 it is the series
    w + w^2/2 + w^3/3 of w = 1 - u (exact in float32: u is a multiple of 2^-24), whose relative error is under
    3e-7; above, the logarithm's 1e-7 is at most 1e-5 of -log(u)."""
    w = 1.0 - uniform
    series = w + w * w * (0.5 + w * (1.0 / 3.0))
    return _approx_log(tl.where(w < 0.01, series, -_approx_log(uniform, HARDWARE_LOG)), HARDWARE_LOG)


@triton.jit
def _allowed_logits(logit, bits_ptr, bits_stride, row, cols, valid, MASKED: tl.constexpr):
    """Under a grammar's token masks (``MASKED``; bit j of word w allows token 32w + j), a disallowed token's logit
    is -inf, as core/constrain/masks.py's ``apply_masks`` makes it; else the logits as they are."""
    if MASKED:
        words = tl.load(bits_ptr + row.to(tl.int64) * bits_stride + cols // 32, mask=valid, other=0)
        logit = tl.where(((words >> (cols % 32)) & 1) != 0, logit, float("-inf"))
    return logit


@triton.jit
def race_chunks_kernel(logits_ptr, row_stride, temperatures_ptr, seeds_ptr, positions_ptr, vocab, part_max_ptr,
                       part_col_ptr, chunks, bits_ptr, bits_stride, BLOCK: tl.constexpr, MASK: tl.constexpr,
                       MIX: tl.constexpr, COLUMN: tl.constexpr, SCREEN: tl.constexpr, HARDWARE_LOG: tl.constexpr,
                       MASKED: tl.constexpr):
    """One program per (row, chunk of BLOCK columns): the chunk's largest score and its first column. Each
    program derives its row's key itself (a few scalar operations), so no kernel before it computes the keys.

    ``SCREEN``: the scores are first taken cheaply (a product with 1/T for the exact quotient, the hardware's
    logarithm and a short series for the exact logarithms: _approx_noise), each within about 1e-6 of its score
    plus 3e-5. Where the cheap best leads the cheap runner-up by far more than twice that, it is the exact best too,
    and alone; only its exact score is computed. Otherwise (a near tie, about one chunk in a few thousand on flat
    logits; an infinite or NaN score) the whole chunk is scored exactly. Either way the chunk reports what the
    exact scores give, with most of the arithmetic (the race's bound) skipped (docs/BENCHMARKS.md).

    ``MASKED``: a grammar's masks (``bits_ptr``) read here, the logits never rewritten (_allowed_logits)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offsets = tl.arange(0, BLOCK)
    cols = chunk * BLOCK + offsets
    valid = cols < vocab
    row_logits = logits_ptr + row.to(tl.int64) * row_stride
    logit = tl.load(row_logits + cols, mask=valid, other=0.0).to(tl.float32)
    logit = _allowed_logits(logit, bits_ptr, bits_stride, row, cols, valid, MASKED)
    temperature = tl.load(temperatures_ptr + row)
    key = _row_key(seeds_ptr, positions_ptr, row, MASK, MIX)
    uniform = _uniform(key, cols, MASK, MIX, COLUMN)
    out = row * chunks + chunk
    if SCREEN:
        cheap = logit * (1.0 / temperature) - _approx_noise(uniform, HARDWARE_LOG)
        cheap = tl.where(cheap == cheap, cheap, float("inf"))  # a NaN makes the chunk take the exact path
        cheap = tl.where(valid, cheap, float("-inf"))
        best = tl.argmax(cheap, 0, tie_break_left=True)
        top = tl.max(cheap, 0)
        runner_up = tl.max(tl.where(offsets == best, float("-inf"), cheap), 0)
        margin = 4e-4 + 1e-5 * (tl.abs(top) + tl.abs(runner_up))
        if (top - runner_up > margin) & (top < float("inf")):
            col = chunk * BLOCK + best  # finite: an allowed token, whose logit is the stored one
            one = tl.load(row_logits + col).to(tl.float32)
            score = tl.math.div_rn(one, temperature) - tl.log(-tl.log(_uniform(key, col, MASK, MIX, COLUMN)))
            tl.store(part_max_ptr + out, score)
            tl.store(part_col_ptr + out, col.to(tl.int64))
        else:
            _store_exact_best(logit, temperature, uniform, valid, chunk, part_max_ptr + out, part_col_ptr + out, BLOCK)
    else:
        _store_exact_best(logit, temperature, uniform, valid, chunk, part_max_ptr + out, part_col_ptr + out, BLOCK)


@triton.jit
def _store_exact_best(logit, temperature, uniform, valid, chunk, max_ptr, col_ptr, BLOCK: tl.constexpr):
    """The chunk's exact scores (torch's: an exactly rounded quotient, then the logarithms): its largest, and its
    first column that has it."""
    score = tl.math.div_rn(logit, temperature) - tl.log(-tl.log(uniform))
    score = tl.where(valid, score, float("-inf"))
    best = tl.argmax(score, 0, tie_break_left=True)
    tl.store(max_ptr, tl.max(score, 0))
    tl.store(col_ptr, (chunk * BLOCK + best).to(tl.int64))


@triton.jit
def argmax_chunks_kernel(logits_ptr, row_stride, vocab, part_max_ptr, part_col_ptr, chunks, bits_ptr, bits_stride,
                         BLOCK: tl.constexpr, MASKED: tl.constexpr):
    """The greedy pick's first stage, race_chunks_kernel without the noise: a chunk's largest logit and its
    first column."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    valid = cols < vocab
    logit = tl.load(logits_ptr + row.to(tl.int64) * row_stride + cols, mask=valid, other=float("-inf"))
    logit = _allowed_logits(logit.to(tl.float32), bits_ptr, bits_stride, row, cols, valid, MASKED)
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
