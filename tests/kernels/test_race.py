"""The sampler's exponential race on the Triton kernels (core/kernels/cuda/race.py) draws exactly the tokens of the
torch race, whatever the vocabulary's cut into chunks, on float32 and bf16 logits.

It runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton installed); it is
skipped elsewhere, and the GPU check runs it for real.
"""

from __future__ import annotations

import pytest
import torch

from core.constrain.masks import TokenMasks, apply_masks
from core.engine.sampler import SampleArgs, Sampler, _race, hashed_uniform
from core.kernels.cuda.race import BLOCK, TRITON_SAMPLING, greedy_tokens, race_tokens
from core.kernels.cuda.triton_available import triton_runs_on

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


@pytest.mark.parametrize("scale", [0.01, 3.0, 30.0])  # near flat (random weights), spread, peaked (a trained model)
def test_the_screened_race_draws_the_exact_races_tokens(scale):
    """The default screens each chunk on cheap scores first: its tokens are the exact scoring's, at any spread of
    the logits."""
    gen = torch.Generator().manual_seed(int(scale * 100))
    rows, vocab = 8, 2 * BLOCK + 77
    logits = (torch.randn(rows, vocab, generator=gen) * scale).to(DEVICE)
    temperatures = (torch.rand(rows, generator=gen) * 1.5 + 0.05).to(DEVICE)
    seeds = torch.randint(0, 2 ** 40, (rows,), generator=gen).to(DEVICE)
    positions = torch.randint(0, 4096, (rows,), generator=gen).to(DEVICE)
    screened = race_tokens(logits, temperatures, seeds, positions)
    assert torch.equal(screened, race_tokens(logits, temperatures, seeds, positions, screen=False))
    assert torch.equal(screened.cpu(), _race(logits, temperatures, seeds, positions).cpu())


def _near_tie(seed: int, a: int, b: int, temperature: torch.Tensor) -> float | None:
    """A logit for column ``b`` whose score ties column ``a``'s (logit 10) so closely that the cheap scores (the
    product with 1/T) order the two one way and the exact scores the other, or None if no nudge of a few ulps
    does that for this seed."""
    log_e = torch.log(-torch.log(hashed_uniform(torch.tensor([seed]), torch.tensor([40]), b + 1)))[0]
    ten, reciprocal = torch.tensor(10.0), 1.0 / temperature
    logit = (ten / temperature - log_e[a] + log_e[b]) * temperature
    for _ in range(12):
        exact_b = bool(logit / temperature - log_e[b] > ten / temperature - log_e[a])
        cheap_b = bool(logit * reciprocal - log_e[b] > ten * reciprocal - log_e[a])
        if exact_b != cheap_b:
            return float(logit)
        logit = torch.nextafter(logit, torch.tensor(1e9))
    return None


def test_a_near_tie_inside_a_chunk_is_settled_by_the_exact_scores():
    """Two columns of one chunk whose scores differ by less than a rounding, ordered one way by the cheap scores
    and the other by the exact ones: the screen's margin sends the chunk down the exact path, and the token is
    the exact race's."""
    temperature = torch.tensor(0.6)
    a, b = BLOCK + 3, BLOCK + 9  # both in the second chunk
    cases = [(seed, logit) for seed in range(11, 60) if (logit := _near_tie(seed, a, b, temperature)) is not None]
    assert len(cases) >= 2, "no near tie found to test with"
    rows = len(cases)
    logits = torch.full((rows, BLOCK + 50), -30.0)
    logits[:, a] = 10.0
    logits[:, b] = torch.tensor([logit for _, logit in cases])
    seeds, positions = torch.tensor([seed for seed, _ in cases]), torch.full((rows,), 40)
    temperatures = temperature.repeat(rows)
    tokens = race_tokens(logits.to(DEVICE), temperatures.to(DEVICE), seeds.to(DEVICE), positions.to(DEVICE))
    assert torch.equal(tokens.cpu(), _race(logits, temperatures, seeds, positions))
    assert set(tokens.tolist()) <= {a, b}


def test_infinite_and_nan_logits_draw_what_the_exact_scores_draw():
    logits = torch.randn(3, BLOCK + 20)
    logits[0, 7] = float("inf")
    logits[1, 3] = float("nan")
    logits[2, BLOCK + 4] = float("-inf")
    args = [t.to(DEVICE) for t in (logits, torch.full((3,), 0.8), torch.arange(3), torch.arange(3))]
    assert torch.equal(race_tokens(*args), race_tokens(*args, screen=False))


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
    on_kernels = Sampler(torch.device(DEVICE), kernels=TRITON_SAMPLING).sample(logits, args)
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


@pytest.mark.parametrize("rows, vocab", [(1, 37), (3, 2 * BLOCK + 77)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_under_masks_the_kernels_draw_and_pick_what_the_masked_logits_give(rows, vocab, dtype):
    """A grammar's masks read by the kernels themselves give the tokens of the torch race and argmax over
    ``apply_masks``'s logits: sparse masks (a few tokens allowed, one row a single one, a chunk with none) and
    dense ones; a sharp logit that the mask forbids is never drawn; the sampler takes that path, tokens the same."""
    gen = torch.Generator().manual_seed(rows + vocab)
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(dtype)
    logits[:, 0] = 1e4  # forbidden below: a pick that ignored the masks would take it
    allowed = torch.rand(rows, vocab, generator=gen) < torch.tensor([0.002, 0.5, 0.9])[:rows, None]
    allowed[:, 0] = False
    allowed[0] = False
    allowed[0, vocab - 2] = True  # the first row allows one token alone, in the last chunk
    words = -(-vocab // 32)
    padded = torch.zeros(rows, words * 32, dtype=torch.int64)
    padded[:, :vocab] = allowed.long()
    bits = (padded.view(rows, words, 32) << torch.arange(32)).sum(-1).to(torch.int64)
    bits = torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32)
    masks = TokenMasks(list(range(rows)), bits)
    masked = apply_masks(logits, masks)
    temperatures = (torch.rand(rows, generator=gen) + 0.3).to(DEVICE)
    seeds = torch.randint(0, 2 ** 62, (rows,), generator=gen).to(DEVICE)
    positions = torch.randint(0, 4096, (rows,), generator=gen).to(DEVICE)
    on = lambda t: t.to(DEVICE)
    drawn = race_tokens(on(logits), temperatures, seeds, positions, bits=on(bits)).cpu()
    assert torch.equal(drawn, _race(on(masked), temperatures, seeds, positions).cpu())
    assert drawn[0] == vocab - 2 and all(allowed[r, t] for r, t in enumerate(drawn.tolist()))
    assert torch.equal(greedy_tokens(on(logits), bits=on(bits)).cpu(), masked.float().argmax(dim=-1))
    args = SampleArgs(temperatures=temperatures, top_k=on(torch.full((rows,), -1)), top_p=on(torch.ones(rows)),
                      seeds=seeds, positions=positions, greedy_rows=on(torch.arange(rows) == rows - 1),
                      masks=TokenMasks(list(range(rows)), on(bits)))
    on_kernels = Sampler(torch.device(DEVICE), kernels=TRITON_SAMPLING).sample(on(logits), args)
    assert torch.equal(on_kernels, Sampler(torch.device(DEVICE), compile=False).sample(on(logits), args))
