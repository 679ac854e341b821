"""Structured output in the engine: every reply under a JSON schema, a regular expression or a choice matches it,
greedy and sampled at temperature 1, alone or beside free requests, with the plain loop and the overlap loop
alike; a grammar that is complete ends its request ('stop'), one cut short by max_tokens says 'length'; a bad
schema or regular expression is refused when the request is made, naming what is wrong."""

from __future__ import annotations

import json
import re
from typing import Literal

import pydantic
import pytest
import torch

from core import LLM, SamplingParams
from core.constrain.fill import MaskFill
from core.constrain.masks import GrammarRows, TokenMasks, advance, apply_masks
from core.constraint import Constraint
from core.scheduler import grammar_step
from core.errors import InvalidConstraintError, InvalidParamsError

MODEL = "llama"  # random weights over a byte-level tokenizer: the mask alone makes the replies valid


class Pet(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")  # no properties beyond these: the object has to end
    name: str = pydantic.Field(max_length=6)
    age: int = pydantic.Field(ge=0, le=30)
    kind: Literal["cat", "dog"]
    tags: list[Literal["a", "b"]] = pydantic.Field(max_length=2)


PET = Constraint.json_schema(Pet.model_json_schema())
CODE = r"[A-Z]{2}-[0-9]{2,3}"
CHOICES = ("yes", "no", "not sure")


@pytest.fixture(scope="module")
def llm(model_dirs):
    return LLM(model_dirs[MODEL], max_running_req=16)


def sampled(constraint: Constraint, seeds: range, max_tokens: int = 96) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=s, constraint=constraint) for s in seeds]


def test_bad_constraints_are_refused_when_made_naming_what_is_wrong():
    with pytest.raises(InvalidConstraintError, match="objekt"):
        Constraint.json_schema({"type": "objekt"})
    with pytest.raises(InvalidConstraintError, match="unclosed character class"):
        Constraint.regex("[a-")
    with pytest.raises(InvalidConstraintError, match="not JSON"):
        Constraint.json_schema("{type: object")
    with pytest.raises(InvalidConstraintError, match="non-empty list"):
        Constraint.choice([])
    with pytest.raises(InvalidConstraintError, match="unknown name"):
        Constraint.lark("start: missing_rule")
    with pytest.raises(InvalidParamsError, match="constraint"):
        SamplingParams(constraint="[0-9]+")
    assert Constraint.json_schema(Pet.model_json_schema()) == PET  # hashable: compiled once per distinct one


def test_every_sampled_reply_matches_its_constraint(llm):
    """Temperature 1, a seed each, all in one batch with free requests: each constrained reply validates and
    ends because its grammar did; the free ones are what they are alone."""
    free = [SamplingParams(max_tokens=12, temperature=1.0, seed=s) for s in range(3)]
    params = sampled(PET, range(12)) + sampled(Constraint.regex(CODE), range(6)) + \
        sampled(Constraint.choice(CHOICES), range(6)) + sampled(Constraint.json_object(), range(3), 64) + free
    out = llm.generate(["pet:"] * len(params), params)
    pets, codes, choices, objects, rest = out[:12], out[12:18], out[18:24], out[24:27], out[27:]
    for r in pets:
        Pet.model_validate_json(r["text"])
        assert r["finish_reason"] == "stop", r
    assert all(re.fullmatch(CODE, r["text"]) and r["finish_reason"] == "stop" for r in codes), codes
    assert all(r["text"] in CHOICES and r["finish_reason"] == "stop" for r in choices), choices
    for r in objects:
        assert r["finish_reason"] == "length" or isinstance(json.loads(r["text"]), dict), r
    alone = llm.generate(["pet:"] * 3, free)
    assert [r["token_ids"] for r in rest] == [r["token_ids"] for r in alone]


def test_a_reply_cut_mid_grammar_says_length_and_a_complete_grammar_stops_without_eos(llm):
    cut, done = llm.generate(["x", "x"], [SamplingParams(max_tokens=4, constraint=Constraint.regex("a{10}")),
                                          SamplingParams(max_tokens=40, constraint=Constraint.regex("b{3}"))])
    assert (cut["text"], cut["finish_reason"]) == ("aaaa", "length")
    assert (done["text"], done["finish_reason"]) == ("bbb", "stop")


def test_eos_is_allowed_only_where_the_grammar_accepts(llm):
    """The mask of "[0-9]+": digits and no EOS at the start; after one digit, EOS too."""
    matcher = llm.scheduler.grammars.matcher(Constraint.regex("[0-9]+"))
    [eos] = llm.eos_token_ids
    digits = {t for d in "0123456789" for t in llm.tokenize(d)}

    def allowed() -> set[int]:
        bits = MaskFill(GrammarRows([0], [matcher]), llm.vocab_size, torch.device("cpu")).take().bits[0]
        return {t for t in range(llm.vocab_size) if bits[t // 32] >> (t % 32) & 1}

    assert allowed() == digits
    matcher.consume_token(min(digits))
    assert allowed() == digits | {eos}


def test_advancing_ends_a_request_where_its_grammar_completes_or_a_token_breaks_it(llm):
    constraint = Constraint.regex("ab")
    [a], [b], [z] = llm.tokenize("a"), llm.tokenize("b"), llm.tokenize("z")
    matcher, broken = llm.scheduler.grammars.matcher(constraint), llm.scheduler.grammars.matcher(constraint)
    assert [advance(matcher, a), advance(matcher, b)] == [False, True] and not matcher.is_error()
    assert advance(broken, z) and broken.is_error()


def test_masks_set_exactly_the_disallowed_logits_to_minus_infinity():
    """Every row masked (one addition) or some rows (gathered and put back): allowed logits keep their exact
    values, disallowed ones are -inf, and unmasked rows are untouched; the model's own logits stay as they were."""
    torch.manual_seed(0)
    logits, bits = torch.randn(4, 70), torch.randint(-2**31, 2**31 - 1, (4, 3), dtype=torch.int32)
    allowed = torch.tensor([[bool(int(bits[r, t // 32]) >> (t % 32) & 1) for t in range(70)] for r in range(4)])
    before = logits.clone()
    every = apply_masks(logits, TokenMasks(list(range(4)), bits))
    assert torch.equal(every, torch.where(allowed, logits, float("-inf")))
    some = apply_masks(logits, TokenMasks([1, 3], bits[[1, 3]]))
    assert torch.equal(some[[0, 2]], logits[[0, 2]]) and torch.equal(some[[1, 3]], every[[1, 3]])
    assert torch.equal(logits, before)


def test_the_overlap_loop_gives_the_plain_loops_tokens(model_dirs, monkeypatch):
    """Under overlap scheduling a constrained batch samples once the step before has moved its matchers on, its
    masks filled inline or on the worker thread while the next step is scheduled: greedy and seeded, mixed with a
    free request, queued for rows, the tokens are the plain loop's."""
    small = Constraint.json_schema({"type": "object", "additionalProperties": False, "required": ["k", "n"],
                                    "properties": {"k": {"enum": ["cat", "dog"]},
                                                   "n": {"type": "integer", "minimum": 0, "maximum": 9}}})
    params = sampled(small, range(4), 24) + [SamplingParams(max_tokens=24, constraint=small),
                                             SamplingParams(max_tokens=10, temperature=1.0, seed=9)]
    tokens = {}
    for overlap, worker_from in ((False, 0), (True, 1000), (True, 1)):  # rows from which the worker fills
        monkeypatch.setattr(grammar_step, "BACKGROUND_ROWS", worker_from)
        llm = LLM(model_dirs[MODEL], max_running_req=4, overlap=overlap)
        out = llm.generate(["a", "bb", "ccc", "dddd", "e", "ff"], params)
        for r in out[:5]:
            assert set(json.loads(r["text"])) == {"k", "n"} and r["finish_reason"] == "stop", r
        tokens[overlap, worker_from] = [r["token_ids"] for r in out]
    assert tokens[True, 1000] == tokens[False, 0] == tokens[True, 1]


def test_a_preempted_request_keeps_its_grammar(model_dirs, llm):
    """A pool too small for every request at once preempts some (recomputed later from prompt and output): their
    matchers stay on them, so under overlap scheduling too the tokens are those of a run that never preempted."""
    schema = Constraint.json_schema({"type": "object", "additionalProperties": False, "required": ["k", "s"],
                                     "properties": {"k": {"enum": ["cat", "dog"]},
                                                    "s": {"type": "string", "maxLength": 12}}})
    params = sampled(schema, range(8), 48)
    prompts = [f"p{i}" * 3 for i in range(8)]
    small = LLM(model_dirs[MODEL], max_running_req=8, num_pages=120, overlap=True)
    out = small.generate(prompts, params)
    assert small.stats()["preemptions"] > 0
    assert [r["token_ids"] for r in out] == [r["token_ids"] for r in llm.generate(prompts, params)]
    assert all(set(json.loads(r["text"])) == {"k", "s"} for r in out)
