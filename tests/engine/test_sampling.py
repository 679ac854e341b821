"""Sampling: seeded draws are reproducible whatever shares the batch; top-k=1 and tiny top-p are greedy."""

from __future__ import annotations

import pytest
import torch

from core import LLM, SamplingParams
from core.engine.sampler import SampleArgs, Sampler, hashed_uniform


@pytest.fixture(scope="module")
def llm(model_dirs) -> LLM:
    return LLM(model_dirs["llama"], max_running_req=8)


PROMPT = [10, 20, 30, 40]


def test_same_seed_same_tokens_alone_and_in_a_batch(llm):
    seeded = SamplingParams(max_tokens=12, temperature=1.0, seed=1234, ignore_eos=True)
    alone = llm.generate([PROMPT], seeded)[0]["token_ids"]
    others = [SamplingParams(max_tokens=n, temperature=0.7, seed=s, ignore_eos=True) for s, n in [(1, 3), (2, 15)]]
    batch = llm.generate([[1, 2], PROMPT, [3, 4, 5, 6, 7]], [others[0], seeded, others[1]])
    assert batch[1]["token_ids"] == alone


def test_different_seeds_differ_and_temperature_zero_is_greedy(llm):
    greedy = llm.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0]["token_ids"]
    draws = {tuple(llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=1.5, seed=s,
                                                          ignore_eos=True))[0]["token_ids"]) for s in range(4)}
    assert len(draws) > 1
    assert tuple(greedy) not in draws or len(draws) > 1


def test_top_k_one_and_tiny_top_p_equal_greedy(llm):
    greedy = llm.generate([PROMPT], SamplingParams(max_tokens=10, ignore_eos=True))[0]["token_ids"]
    top_k = llm.generate([PROMPT], SamplingParams(max_tokens=10, temperature=1.0, top_k=1, seed=7,
                                                  ignore_eos=True))[0]["token_ids"]
    top_p = llm.generate([PROMPT], SamplingParams(max_tokens=10, temperature=1.0, top_p=1e-6, seed=7,
                                                  ignore_eos=True))[0]["token_ids"]
    assert top_k == greedy
    assert top_p == greedy


def test_top_k_restricts_draws_to_the_k_most_likely(llm):
    """With top_k=2, every sampled token is one of the two most likely at its step."""
    params = SamplingParams(max_tokens=1, temperature=5.0, top_k=2, ignore_eos=True)
    firsts = {llm.generate([PROMPT], SamplingParams(**{**params.__dict__, "seed": s}))[0]["token_ids"][0]
              for s in range(40)}
    logits = _first_logits(llm, PROMPT)
    assert firsts == set(logits.topk(2).indices.tolist())


def test_a_top_k_past_any_vocabulary_keeps_every_token(llm):
    """top_k from the vocabulary's size up filters nothing, however large (it is capped before the upload): the
    draws are those of the same top-k path with k the vocabulary."""
    vocab = llm.engine.model_config.vocab_size
    draws = [[llm.generate([PROMPT], SamplingParams(max_tokens=6, temperature=1.5, top_k=k, seed=s,
                                                    ignore_eos=True))[0]["token_ids"] for s in range(3)]
             for k in (vocab, 10 ** 30)]
    assert draws[0] == draws[1]


def _first_logits(llm: LLM, prompt: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llm.model_dir, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0, -1]


def test_hashed_noise_is_uniform_and_a_pure_function():
    seeds, positions = torch.tensor([1, 2, 1]), torch.tensor([5, 5, 5])
    u = hashed_uniform(seeds, positions, 50000)
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01
    assert abs((u < 0.1).float().mean().item() - 0.1) < 0.01


def test_the_largest_noise_stays_below_one_so_its_token_cannot_win_against_its_logit():
    """Seed 300 at position 7 draws the noise grid's largest value at column 35,170 (found by search): in float32
    it would round to 1, an infinite score, and that column would be drawn even with a logit of -inf (a token
    structured output masks)."""
    u = hashed_uniform(torch.tensor([300]), torch.tensor([7]), 49152)
    assert u.max() < 1 and u[0].argmax() == 35170
    logits = torch.zeros(1, 49152)
    logits[0, 35170] = float("-inf")
    args = SampleArgs(temperatures=torch.ones(1), top_k=torch.tensor([-1]), top_p=torch.ones(1),
                      seeds=torch.tensor([300]), positions=torch.tensor([7]),
                      greedy_rows=torch.zeros(1, dtype=torch.bool), any_greedy=False)
    assert Sampler(torch.device("cpu"), compile=False).sample(logits, args).item() != 35170


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_draws_follow_the_softmax_of_logits_over_temperature(temperature):
    """Over many seeds, each token is drawn about as often as softmax(logits / T) says."""
    from core.engine.sampler import SampleArgs, Sampler

    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    rows = 40000
    args = SampleArgs(temperatures=torch.full((rows,), temperature), top_k=torch.full((rows,), -1),
                      top_p=torch.ones(rows), seeds=torch.arange(rows) * 7919 + 13,
                      positions=torch.full((rows,), 5), greedy_rows=torch.zeros(rows, dtype=torch.bool))
    drawn = Sampler(torch.device("cpu"), compile=False).sample(logits.expand(rows, -1), args)
    observed = torch.bincount(drawn, minlength=len(logits)).float() / rows
    expected = torch.softmax(logits / temperature, dim=-1)
    assert torch.allclose(observed, expected, atol=0.01), (observed, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_on_a_cpu_picks_the_first_of_tied_maxima_as_argmax_does(dtype):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 4099, generator=gen).to(dtype)
    logits[1, [7, 300, 4098]] = 50.0  # a three-way tie at the top
    logits[2] = 0.0  # every logit tied
    logits[3, -1] = 80.0  # the maximum last
    greedy = Sampler(torch.device("cpu")).sample(logits, SampleArgs(logprobs=-1))
    assert torch.equal(greedy, logits.argmax(dim=-1))
    assert greedy[1] == 7 and greedy[2] == 0 and greedy[3] == 4098


def test_a_mixed_batch_keeps_greedy_rows_greedy_and_draws_the_others_as_alone():
    """Greedy rows beside sampled ones take their argmax; each sampled row draws what it draws in an all-sampled
    batch (its seed and position alone decide)."""
    from core.engine.sampler import SampleArgs, Sampler

    gen = torch.Generator().manual_seed(5)
    rows, vocab = 6, 3000
    logits = torch.randn(rows, vocab, generator=gen) * 0.3  # flat: draws differ from the argmax
    greedy_rows = torch.tensor([True, False, False, True, False, True])

    def args(greedy: torch.Tensor) -> SampleArgs:
        return SampleArgs(temperatures=torch.full((rows,), 1.0), top_k=torch.full((rows,), -1),
                          top_p=torch.ones(rows), seeds=torch.arange(rows) + 11, positions=torch.full((rows,), 3),
                          greedy_rows=greedy, any_greedy=bool(greedy.any()))

    sampler = Sampler(torch.device("cpu"), compile=False)
    all_sampled = sampler.sample(logits, args(torch.zeros(rows, dtype=torch.bool)))
    mixed = sampler.sample(logits, args(greedy_rows))
    assert torch.equal(mixed[greedy_rows], logits.argmax(dim=-1)[greedy_rows])
    assert torch.equal(mixed[~greedy_rows], all_sampled[~greedy_rows])
    assert not torch.equal(all_sampled, logits.argmax(dim=-1))  # the draws are not the argmax anyway


def test_warm_up_compiles_the_race_for_the_models_dtype_and_for_controlled_float32_logits():
    """Penalized logits reach the race in float32: their variant is compiled at start, not in a step."""
    from core.kernels.sampling import SamplingKernels

    seen = []

    def race(logits, temperatures, seeds, positions):
        seen.append((logits.dtype, logits.shape[0]))
        return torch.zeros(logits.shape[0], dtype=torch.int64)

    sampler = Sampler(torch.device("cpu"), kernels=SamplingKernels(race, lambda logits: logits.argmax(-1), (1, 2, 64)))
    sampler.warm_up(32, torch.bfloat16)
    assert seen == [(torch.bfloat16, 1), (torch.bfloat16, 2), (torch.bfloat16, 64),
                    (torch.float32, 1), (torch.float32, 2), (torch.float32, 64)]
    seen.clear()
    sampler.warm_up(32, torch.float32)  # a float32 model: one variant
    assert seen == [(torch.float32, 1), (torch.float32, 2), (torch.float32, 64)]
