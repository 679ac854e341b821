"""The sampler's exponential race on the Triton kernels (core/kernels/race.py) draws exactly the tokens of the
torch race, whatever the vocabulary's cut into chunks, on float32 and bf16 logits.

It runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed); it is
skipped elsewhere, and the GPU check runs it for real.
"""

from __future__ import annotations

import pytest
import torch

from core.engine.sampler import SampleArgs, Sampler, _race
from core.kernels.race import BLOCK, greedy_tokens, race_tokens
from core.kernels.triton_available import triton_runs_on

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not triton_runs_on(DEVICE),
                                reason="needs triton on CUDA, or TRITON_INTERPRET=1 on a CPU")


@pytest.mark.parametrize("rows, vocab", [(1, 7), (5, BLOCK), (6, BLOCK + 1), (3, 3 * BLOCK - 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernels_draw_the_torch_races_tokens(rows, vocab, dtype):
    gen = torch.Generator().manual_seed(rows * vocab)
    logits = (torch.randn(rows, vocab, generator=gen) * 2).to(dtype).to(DEVICE)
    temperatures = (torch.rand(rows, generator=gen) + 0.3).to(DEVICE)
    seeds = torch.randint(-2 ** 62, 2 ** 62, (rows,), generator=gen).to(DEVICE)  # the key folds the sign too
    positions = torch.randint(0, 4096, (rows,), generator=gen).to(DEVICE)
    tokens = race_tokens(logits, temperatures, seeds, positions)
    assert tokens.dtype == torch.int64 and tokens.shape == (rows,)
    assert torch.equal(tokens.cpu(), _race(logits, temperatures, seeds, positions).cpu())


def test_a_sharp_row_draws_its_top_token_and_rows_of_a_strided_view_read_their_own_logits():
    logits = torch.zeros(3, 2 * BLOCK + 10)
    logits[0, 2 * BLOCK + 3] = 1e4  # in the last, partial chunk
    logits[1, 0] = 1e4
    logits[2, BLOCK] = 1e4  # the first column of a chunk
    wide = torch.zeros(3, 3 * BLOCK)
    wide[:, : logits.shape[1]] = logits
    ones, ids = torch.ones(3), torch.arange(3)
    for view in (logits, wide[:, : logits.shape[1]]):  # contiguous, and rows BLOCK columns further apart
        tokens = race_tokens(view.to(DEVICE), ones.to(DEVICE), ids.to(DEVICE), ids.to(DEVICE))
        assert tokens.tolist() == [2 * BLOCK + 3, 0, BLOCK]


def test_the_sampler_on_the_kernels_draws_what_it_draws_on_torch():
    gen = torch.Generator().manual_seed(9)
    rows, vocab = 4, 3000
    logits = torch.randn(rows, vocab, generator=gen).to(DEVICE)
    args = SampleArgs(temperatures=torch.full((rows,), 0.7, device=DEVICE),
                      top_k=torch.full((rows,), -1, device=DEVICE), top_p=torch.ones(rows, device=DEVICE),
                      seeds=torch.arange(rows, device=DEVICE) + 3, positions=torch.full((rows,), 8, device=DEVICE),
                      greedy_rows=torch.tensor([False, True, False, False], device=DEVICE))
    on_kernels = Sampler(torch.device(DEVICE), triton_race=True).sample(logits, args)
    on_torch = Sampler(torch.device(DEVICE), compile=False).sample(logits, args)
    assert torch.equal(on_kernels, on_torch) and on_kernels[1] == logits[1].argmax()


@pytest.mark.parametrize("rows, vocab", [(1, 7), (1, 3 * BLOCK - 5), (4, BLOCK + 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_greedy_pick_is_argmax_ties_and_minus_infinity_included(rows, vocab, dtype):
    """The first maximal column, as ``argmax`` gives it: ties across chunks, rows that are mostly -inf (what the
    screened LM head returns), and a strided view."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(rows, vocab, generator=gen).round().to(dtype)  # rounded: many ties
    logits[0, : vocab // 2] = float("-inf")
    wide = torch.full((rows, vocab + 9), 5.0, dtype=dtype)
    wide[:, 2:vocab + 2] = logits
    for case in (logits, wide[:, 2:vocab + 2]):
        case = case.to(DEVICE)
        assert torch.equal(greedy_tokens(case).cpu(), case.float().argmax(dim=-1).cpu())
