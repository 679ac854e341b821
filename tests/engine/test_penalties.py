"""The logits controls: penalties, logit bias, min-p, min_tokens and stop token ids, checked against transformers'
processors and a plain reference loop, in batches with requests that set none of them."""

from __future__ import annotations

import pytest
import torch

from core import LLM, InvalidParamsError, SamplingParams
from core.engine.penalties import Penalties
from core.engine.sampler import Sampler
from core.request import Batch, Req
from tests.support.reference import _hf_model

PROMPT = [10, 20, 30, 40, 10, 10]
VOCAB = 12


def _req(input_ids: list[int], prompt_len: int, **params) -> Req:
    n = len(input_ids)
    return Req(0, list(input_ids), prompt_len, 0, n - 1, n, n + 8, SamplingParams(**params), 0)


def _controlled(reqs: list[Req], logits: torch.Tensor, eos: frozenset[int] = frozenset()) -> torch.Tensor:
    batch = Penalties(torch.device("cpu")).prepare(reqs, eos)
    return batch.apply(logits)


def test_presence_and_frequency_subtract_for_generated_tokens_only():
    """OpenAI's: the logit of a token generated c times loses c * frequency + presence; prompt tokens lose nothing."""
    logits = torch.arange(VOCAB, dtype=torch.float32).repeat(2, 1) - 5
    reqs = [_req([1, 2, 3, 3, 5], 2, frequency_penalty=0.5, presence_penalty=1.5, max_tokens=9), _req([1, 2], 2)]
    out = _controlled(reqs, logits)
    expected = logits[0].clone()
    expected[3] -= 2 * 0.5 + 1.5
    expected[5] -= 0.5 + 1.5
    assert torch.equal(out[0], expected)
    assert torch.equal(out[1], logits[1])  # a request without controls is left alone


def test_repetition_penalty_is_transformers_over_prompt_and_generated():
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    ids = [1, 2, 7, 7, 9]
    out = _controlled([_req(ids, 3, repetition_penalty=1.7)], logits)
    expected = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([ids]), logits.clone())
    assert torch.equal(out, expected)


def test_logit_bias_adds_and_min_tokens_holds_back_eos_and_stop_ids():
    logits = torch.zeros(2, VOCAB)
    reqs = [_req([1, 2, 3], 2, logit_bias={4: 100, 6: -2.5}, min_tokens=2, stop_token_ids=[8]),
            _req([1, 2, 3, 4], 2, min_tokens=2, stop_token_ids=[8])]  # two generated: nothing held back
    out = _controlled(reqs, logits, eos=frozenset({11}))
    assert out[0, 4] == 100 and out[0, 6] == -2.5
    assert out[0, 8] == out[0, 11] == float("-inf")
    assert torch.equal(out[1], logits[1])
    ignoring = _controlled([_req([1, 2], 2, min_tokens=1, ignore_eos=True, stop_token_ids=[8])], logits[:1],
                           eos=frozenset({11}))
    assert ignoring[0, 11] == 0 and ignoring[0, 8] == float("-inf")  # ignore_eos: EOS is no stop to hold back


def test_min_p_keeps_what_transformers_keeps():
    from transformers import MinPLogitsWarper

    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)) * 2
    sampler = Sampler(torch.device("cpu"), compile=False)
    reqs = [Req(i, [1], 1, i, 0, 1, 9, SamplingParams(temperature=0.8, min_p=m, seed=i), i)
            for i, m in enumerate([0.05, 0.3, 0.9])]
    args = sampler.prepare(Batch(reqs, "decode"))
    for i, m in enumerate([0.05, 0.3, 0.9]):
        kept = MinPLogitsWarper(m)(None, logits[i:i + 1] / 0.8).isfinite()[0]
        draws = set()
        for seed in range(64):
            args.seeds[:] = seed
            draws.add(int(sampler.sample(logits, args)[i]))
        assert draws <= set(kept.nonzero().view(-1).tolist())
        assert len(draws) > 1 or int(kept.sum()) == 1


@pytest.fixture(scope="module")
def llm(model_dirs) -> LLM:
    return LLM(model_dirs["llama"], max_running_req=4, max_extend_tokens=4)


def _reference(model_dir: str, prompt: list[int], n: int, p: SamplingParams) -> list[int]:
    """Greedy decoding with the penalties applied by hand to transformers' logits, one token at a time."""
    from transformers import RepetitionPenaltyLogitsProcessor

    model, ids, out = _hf_model(model_dir), list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids])).logits[:, -1].float()
            logits = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(torch.tensor([ids]), logits)[0]
            counts = torch.bincount(torch.tensor(out, dtype=torch.int64), minlength=len(logits))
            logits = logits - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
            out.append(int(logits.argmax()))
            ids.append(out[-1])
    return out


@pytest.mark.parametrize("overlap", [False, True])
def test_penalized_greedy_equals_the_reference_in_a_mixed_batch(model_dirs, llm, overlap):
    """The counts live on the device and move on with each sampled token: with overlap scheduling too (the host then
    lags a token), beside requests without penalties, with prompts prefilled in chunks."""
    engine = llm if not overlap else LLM(model_dirs["llama"], max_running_req=4, max_extend_tokens=4, overlap=True)
    penalized = [SamplingParams(max_tokens=14, ignore_eos=True, repetition_penalty=1.6),
                 SamplingParams(max_tokens=16, ignore_eos=True, frequency_penalty=2.0, presence_penalty=1.5,
                                repetition_penalty=0.9)]
    plain = SamplingParams(max_tokens=10, ignore_eos=True)
    out = engine.generate([PROMPT, [5, 6], PROMPT[:3]], [penalized[0], plain, penalized[1]])
    assert out[0]["token_ids"] == _reference(model_dirs["llama"], PROMPT, 14, penalized[0])
    assert out[2]["token_ids"] == _reference(model_dirs["llama"], PROMPT[:3], 16, penalized[1])
    assert out[1]["token_ids"] == llm.generate([[5, 6]], plain)[0]["token_ids"]
    unpenalized = llm.generate([PROMPT, PROMPT[:3]], [SamplingParams(max_tokens=n, ignore_eos=True) for n in (14, 16)])
    assert out[0]["token_ids"] != unpenalized[0]["token_ids"]  # the penalties changed something to compare
    assert out[2]["token_ids"] != unpenalized[1]["token_ids"]


def test_logit_bias_forces_or_bans_a_token(llm):
    greedy = llm.generate([PROMPT], SamplingParams(max_tokens=6, ignore_eos=True))[0]["token_ids"]
    forced = llm.generate([PROMPT, PROMPT], [SamplingParams(max_tokens=6, ignore_eos=True, logit_bias={65: 100}),
                                             SamplingParams(max_tokens=6, ignore_eos=True, logit_bias={65: 100},
                                                            temperature=1.0, seed=3)])
    assert [r["token_ids"] for r in forced] == [[65] * 6] * 2
    banned = llm.generate([PROMPT], SamplingParams(max_tokens=1, logit_bias={greedy[0]: -100}))[0]["token_ids"]
    assert banned != greedy[:1]


def test_stop_token_ids_end_a_request_after_min_tokens(llm):
    greedy = llm.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0]["token_ids"]
    stop_id = greedy[3]
    ended = llm.generate([PROMPT], SamplingParams(max_tokens=12, stop_token_ids=[stop_id]))[0]
    assert ended["finish_reason"] == "stop" and ended["token_ids"] == greedy[:greedy.index(stop_id)]
    held = llm.generate([PROMPT], SamplingParams(max_tokens=12, stop_token_ids=[stop_id], min_tokens=6))[0]
    assert len(held["token_ids"]) >= 6 and stop_id not in held["token_ids"]
    assert held["token_ids"][:greedy.index(stop_id)] == greedy[:greedy.index(stop_id)]


def test_min_tokens_holds_back_eos(llm):
    saved = llm.eos_token_ids
    first = llm.generate([PROMPT], SamplingParams(max_tokens=1))[0]["token_ids"][0]
    try:
        llm.eos_token_ids = frozenset({first})
        assert llm.generate([PROMPT], SamplingParams(max_tokens=8))[0]["token_ids"] == []
        held = llm.generate([PROMPT], SamplingParams(max_tokens=8, min_tokens=3))[0]["token_ids"]
        assert len(held) >= 3 and first not in held[:3]
    finally:
        llm.eos_token_ids = saved


def test_min_p_one_is_greedy_and_token_ids_outside_the_vocabulary_are_refused(llm):
    greedy = llm.generate([PROMPT], SamplingParams(max_tokens=8, ignore_eos=True))[0]["token_ids"]
    assert llm.generate([PROMPT], SamplingParams(max_tokens=8, ignore_eos=True, temperature=2.0, min_p=1.0,
                                                 seed=5))[0]["token_ids"] == greedy
    vocab = llm.vocab_size
    out = llm.generate([PROMPT, PROMPT], [SamplingParams(logit_bias={vocab: 1}), SamplingParams(stop_token_ids=[vocab])])
    assert [r["finish_reason"] for r in out] == ["error", "error"]
    assert "logit_bias" in out[0]["error"] and "stop_token_ids" in out[1]["error"]


@pytest.mark.parametrize("fields, fragment", [
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": float("nan")}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_p": 1.5}, "min_p"),
    ({"min_tokens": 17}, "min_tokens"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"logit_bias": {1: 101}}, "logit_bias"), ({"logit_bias": {"a": 1}}, "logit_bias"),
])
def test_bad_controls_are_refused_by_name(fields, fragment):
    with pytest.raises(InvalidParamsError, match=fragment):
        SamplingParams(**fields)


def test_min_p_draws_only_what_transformers_keeps_at_every_step(model_dirs, llm):
    """A seeded min-p generation, replayed through transformers: at every step the engine's token is one that
    transformers' ``MinPLogitsWarper`` keeps after the same temperature. Which of them is drawn is the sampler's own
    (a seeded race, not ``torch.multinomial``), so the tokens themselves differ from transformers' sampling."""
    from transformers import MinPLogitsWarper

    params = SamplingParams(max_tokens=16, temperature=1.5, min_p=0.2, seed=4, ignore_eos=True)
    tokens = llm.generate([PROMPT], params)[0]["token_ids"]
    with torch.no_grad():
        logits = _hf_model(model_dirs["llama"])(input_ids=torch.tensor([PROMPT + tokens])).logits[0].float()
    steps = logits[len(PROMPT) - 1:-1] / params.temperature
    kept = MinPLogitsWarper(params.min_p)(None, steps).isfinite()
    assert all(kept[i, token] for i, token in enumerate(tokens))
    assert int((kept.sum(-1) > 1).sum()) >= 4  # several steps had a real choice
