"""``minisgl serve`` as OpenAI clients see it: a real server process on 127.0.0.1, the official openai client.

Greedy answers equal LLM.generate token for token, streamed chunks join to the same text, stop strings and
logprobs (against transformers' log-softmax, CPU float32), 64 concurrent clients, a client killed mid-stream or
while its whole answer is made, every error in OpenAI's shape, a full queue, and SIGTERM with requests in flight.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import urllib.request
from typing import Any, Literal

import openai
import pydantic
import pytest
import torch

from core import LLM, SamplingParams
from render.trace_format import read_trace
from tests.support.serve import WAIT_S, Server, assert_openai_error, request

MODEL = "llama"
PROMPTS = ["hello there", "a", "The quick brown fox jumps", "0123456789 0123456789"]


@pytest.fixture(scope="module")
def model_dir(api_model_dir):
    return api_model_dir


@pytest.fixture(scope="module")
def server(api_server):  # tests/server/conftest.py's, shared with test_hostile.py
    return api_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", timeout=WAIT_S, max_retries=0)


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), cache="naive", max_running_req=8, page_size=2)


def greedy(max_tokens: int, **extra) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **extra)


def chat_ids(llm: LLM, text: str) -> list[int]:
    ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def post(server: Server, path: str, body: bytes | str) -> tuple[int, dict, Any]:
    data = body.encode() if isinstance(body, str) else body
    return request(server, "POST", path, data, {"Content-Type": "application/json"})


def test_greedy_completions_equal_generate(client, llm):
    expected = llm.generate(PROMPTS, greedy(12))
    for prompt, want in zip(PROMPTS, expected):
        got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                        extra_body={"ignore_eos": True})
        choice = got.choices[0]
        assert (choice.text, choice.finish_reason) == (want["text"], "length")
        assert got.usage.completion_tokens == len(want["token_ids"]) == 12
        assert got.usage.prompt_tokens == want["prompt_tokens"]


def test_token_id_prompt_and_eos_stop_match_generate(client, llm):
    ids = llm.tokenize("The quick brown fox jumps")
    want = llm.generate([ids], SamplingParams(max_tokens=40))[0]
    got = client.completions.create(model=MODEL, prompt=ids, max_tokens=40, temperature=0)
    assert (got.choices[0].text, got.choices[0].finish_reason) == (want["text"], want["finish_reason"])
    assert got.usage.completion_tokens == len(want["token_ids"])


def test_greedy_chat_equals_generate(client, llm):
    for text in PROMPTS[:2]:
        want = llm.generate([chat_ids(llm, text)], greedy(10))[0]
        got = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                             max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
        assert got.choices[0].message.role == "assistant"
        assert got.choices[0].message.content == want["text"]
        assert got.usage.prompt_tokens == len(chat_ids(llm, text))
        assert got.usage.completion_tokens == 10


def test_text_parts_and_fields_that_change_no_token_answer_as_plain_chat(client, llm):
    """Content as text parts reads as their joined text; labels, hints and the default tier are accepted."""
    want = llm.generate([chat_ids(llm, "hello there")], greedy(6))[0]
    got = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "hello "},
                                                            {"type": "text", "text": "there"}]}],
        max_tokens=6, temperature=0, store=False, metadata={"team": "a"}, service_tier="auto",
        prompt_cache_key="greeting", safety_identifier="user-1", user="u", modalities=["text"],
        extra_body={"ignore_eos": True})
    assert got.choices[0].message.content == want["text"]


def test_n_choices_of_several_prompts_each_equal_generate_with_its_seed(client, llm):
    """Choice i*n+j is prompt i's j-th choice, sampled with seed + j: each equals LLM.generate with that seed."""
    prompts, n, seed = [PROMPTS[0], PROMPTS[2]], 3, 7

    def sampled(j: int) -> SamplingParams:
        return SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.9, seed=seed + j)

    want = [llm.generate([p], sampled(j))[0] for p in prompts for j in range(n)]
    got = client.completions.create(model=MODEL, prompt=prompts, n=n, max_tokens=8, temperature=0.9, seed=seed,
                                    extra_body={"ignore_eos": True})
    assert [c.index for c in got.choices] == list(range(len(prompts) * n))
    assert [c.text for c in got.choices] == [w["text"] for w in want]
    assert len({c.text for c in got.choices[:n]}) > 1  # the seeds differ, so do the choices
    assert got.usage.prompt_tokens == sum(llm.generate([p], greedy(1))[0]["prompt_tokens"] for p in prompts)
    assert got.usage.completion_tokens == len(prompts) * n * 8

    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=n,
                                                 max_tokens=6, temperature=0.9, seed=seed, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    for j in range(n):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == j]
        expected = llm.generate([chat_ids(llm, "hi")], SamplingParams(max_tokens=6, ignore_eos=True,
                                                                      temperature=0.9, seed=seed + j))[0]
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason == "length"
        assert "".join(c.delta.content or "" for c in mine) == expected["text"]
    assert chunks[-1].usage.completion_tokens == n * 6


def test_a_prompt_refused_among_several_refuses_the_request_and_frees_the_rest(server):
    before = server.metrics()
    code, reply, _ = post(server, "/v1/completions", json.dumps({"model": MODEL, "prompt": ["hi", "y" * 601],
                                                                 "max_tokens": 16, "n": 2}))
    assert code == 400 and reply["error"]["code"] == "context_length_exceeded"
    after = server.wait_metrics(lambda m: m["requests_in_flight"] == m["requests_running"] == 0)
    assert after["requests_in_flight"] == 0 and after["requests_running"] == 0  # the engine's figure: a step later
    aborted = 'requests_finished_total{finish_reason="abort"}'
    assert after[aborted] == before[aborted] + 2  # the first prompt's two choices, started before the refusal


def test_streamed_chunks_join_to_the_same_text(client, llm):
    want = llm.generate([PROMPTS[2]], greedy(20))[0]
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20

    want = llm.generate([chat_ids(llm, "hi")], greedy(15))[0]
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=15, temperature=0, stream=True,
                                                 extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want["text"]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_continuous_usage_stats_puts_the_counts_so_far_in_every_chunk(client):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True},
                                            extra_body={"ignore_eos": True}))
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 12 and all(c.usage is not None for c in chunks)
    assert len({c.usage.prompt_tokens for c in chunks}) == 1
    with pytest.raises(openai.BadRequestError, match="needs 'include_usage'"):
        client.completions.create(model=MODEL, prompt="hi", stream=True,
                                  stream_options={"continuous_usage_stats": True})


def test_stop_strings_cut_the_text_before_them(client, llm):
    full = llm.generate([PROMPTS[0]], greedy(30))[0]["text"]
    stop = full[6:8]
    want = full[:full.find(stop)]
    offline = llm.generate([PROMPTS[0]], greedy(30, stop=(stop, "never there")))[0]
    assert (offline["text"], offline["finish_reason"], offline["stop"]) == (want, "stop", stop)
    assert len(offline["token_ids"]) < 30

    got = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=30, temperature=0,
                                    stop=[stop, "never there"], extra_body={"ignore_eos": True})
    assert (got.choices[0].text, got.choices[0].finish_reason) == (want, "stop")
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=30, temperature=0,
                                            stop=stop, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_the_logits_controls_equal_generate(client, llm):
    """The penalties and logit bias as the openai client sends them, vLLM's extensions through extra_body, on
    completions and on a streamed chat: each the same tokens as generate with the same SamplingParams."""
    controls = dict(presence_penalty=0.5, frequency_penalty=1.5, logit_bias={"70": 4})
    extensions = dict(repetition_penalty=1.4, min_p=0.05)
    extra = dict(**extensions, ignore_eos=True)
    want = llm.generate([PROMPTS[2]], greedy(10, **controls, **extensions))[0]
    got = client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=10, temperature=0, **controls,
                                    extra_body=extra)
    assert got.choices[0].text == want["text"] and got.usage.completion_tokens == 10
    want = llm.generate([chat_ids(llm, "hello there")], greedy(8, **controls, **extensions))[0]
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello there"}],
                                            max_tokens=8, temperature=0, stream=True, **controls, extra_body=extra)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want["text"]
    forced = client.completions.create(model=MODEL, prompt="a", max_tokens=4, temperature=1, seed=3,
                                       logit_bias={"65": 100}, extra_body={"ignore_eos": True})
    assert forced.choices[0].text == llm.tokenizer.decode([65]) * 4


def test_stop_token_ids_end_a_choice_after_min_tokens(client, llm):
    ids = llm.generate([PROMPTS[0]], greedy(12))[0]["token_ids"]
    stop_id = ids[2]
    got = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0,
                                    extra_body={"stop_token_ids": [stop_id]})
    want = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=12, stop_token_ids=[stop_id]))[0]
    assert got.choices[0].finish_reason == "stop" and got.choices[0].text == want["text"]
    assert got.usage.completion_tokens == len(want["token_ids"]) == ids.index(stop_id)
    held = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0,
                                     extra_body={"stop_token_ids": [stop_id], "min_tokens": 5})
    assert held.usage.completion_tokens >= 5


def test_logprobs_equal_transformers_log_softmax(client, llm, model_dir):
    from transformers import AutoModelForCausalLM

    prompt = PROMPTS[2]
    want = llm.generate([prompt], greedy(8))[0]
    prompt_ids = llm.tokenize(prompt)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + want["token_ids"]])).logits[0]
    reference = torch.log_softmax(logits.float(), dim=-1)[len(prompt_ids) - 1:-1]
    top_values, top_ids = reference.topk(3, dim=-1)

    got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, logprobs=3,
                                    extra_body={"ignore_eos": True}).choices[0].logprobs
    chosen = reference.gather(-1, torch.tensor(want["token_ids"])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(got.token_logprobs), chosen, atol=1e-4)
    assert [max(d.values()) for d in got.top_logprobs] == pytest.approx(top_values[:, 0].tolist(), abs=1e-4)

    chat_prompt = chat_ids(llm, "hi")
    want = llm.generate([chat_prompt], greedy(6))[0]
    with torch.no_grad():
        logits = model(torch.tensor([chat_prompt + want["token_ids"]])).logits[0]
    reference = torch.log_softmax(logits.float(), dim=-1)[len(chat_prompt) - 1:-1]
    got = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                         temperature=0, logprobs=True, top_logprobs=3,
                                         extra_body={"ignore_eos": True}).choices[0].logprobs.content
    assert len(got) == 6
    for row, entry in zip(reference, got):
        values, _ = row.topk(3)
        assert entry.logprob == pytest.approx(values[0].item(), abs=1e-4)  # greedy: the top token
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(values.tolist(), abs=1e-4)

    offline = llm.generate([chat_prompt], greedy(6, logprobs=2))[0]["logprobs"]
    assert [e["token_id"] for e in offline] == want["token_ids"]
    assert [e["logprob"] for e in offline] == pytest.approx([g.logprob for g in got], abs=1e-5)


def test_64_concurrent_clients_all_complete_and_pages_come_back(server, llm):
    before = server.metrics()
    lengths = [1 + (i * 7) % 23 for i in range(64)]
    prompts = [("x" * (1 + i % 13)) + str(i) for i in range(64)]
    expected = llm.generate(prompts, [greedy(n) for n in lengths])

    async def one(aclient, i: int) -> tuple[str, str, int]:
        if i % 2:
            stream = await aclient.completions.create(model=MODEL, prompt=prompts[i], max_tokens=lengths[i],
                                                      temperature=0, stream=True,
                                                      stream_options={"include_usage": True},
                                                      extra_body={"ignore_eos": True})
            text, reason, tokens = "", None, -1
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].text
                    reason = chunk.choices[0].finish_reason or reason
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            return text, reason, tokens
        got = await aclient.completions.create(model=MODEL, prompt=prompts[i], max_tokens=lengths[i], temperature=0,
                                               extra_body={"ignore_eos": True})
        return got.choices[0].text, got.choices[0].finish_reason, got.usage.completion_tokens

    async def everyone():
        async with openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="none", timeout=WAIT_S,
                                      max_retries=0) as aclient:
            return await asyncio.wait_for(asyncio.gather(*(one(aclient, i) for i in range(64))), 5 * WAIT_S)

    results = asyncio.run(everyone())
    assert results == [(want["text"], "length", n) for want, n in zip(expected, lengths)]
    after = server.wait_metrics(lambda m: m["requests_in_flight"] == 0 and m["kv_pages_free"] == before["kv_pages_free"])
    assert after["kv_pages_free"] == before["kv_pages_free"]
    assert (after["requests_running"], after["requests_waiting"], after["requests_in_flight"]) == (0, 0, 0)
    key = 'requests_finished_total{finish_reason="length"}'
    assert after[key] - before[key] == 64
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == sum(lengths)


def assert_aborted_and_freed(server, before: dict[str, float]) -> None:
    """One more request aborted, none left running, every KV page back, and its 400 tokens never all made."""
    key = 'requests_finished_total{finish_reason="abort"}'
    after = server.wait_metrics(lambda m: m[key] == before[key] + 1 and m["requests_in_flight"] == 0
                                and m["kv_pages_free"] == before["kv_pages_free"])
    assert after[key] == before[key] + 1
    assert (after["requests_running"], after["requests_in_flight"]) == (0, 0)
    assert after["kv_pages_free"] == before["kv_pages_free"]
    assert after["generation_tokens_total"] - before["generation_tokens_total"] < 400


KILLED_CLIENT = """
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0)
for chunk in client.completions.create(model="llama", prompt="long", max_tokens=400, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True}):
    print("chunk", flush=True)
"""


def test_a_client_killed_mid_stream_frees_its_request(server):
    before = server.metrics()
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, server.base + "/v1"], stdout=subprocess.PIPE,
                            text=True)
    try:
        for _ in range(3):
            assert proc.stdout.readline() == "chunk\n"
        assert server.metrics()["requests_running"] == 1
    finally:
        proc.kill()
        proc.wait(10)
    assert_aborted_and_freed(server, before)


WHOLE_ANSWER_CLIENT = """
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0)
client.completions.create(model="llama", prompt="long", max_tokens=400, temperature=0, extra_body={"ignore_eos": True})
"""


def test_a_client_killed_while_its_whole_answer_is_made_frees_its_request(server):
    """Without a stream no chunk ever fails to send: the disconnect alone must end the request, while its
    tokens keep coming."""
    before = server.metrics()
    proc = subprocess.Popen([sys.executable, "-c", WHOLE_ANSWER_CLIENT, server.base + "/v1"])
    try:
        server.wait_metrics(lambda m: m["generation_tokens_total"] > before["generation_tokens_total"])
    finally:
        proc.kill()
        proc.wait(10)
    assert_aborted_and_freed(server, before)


@pytest.mark.parametrize("body, status, fragment, param", [
    ('{"model": "llama", "prompt": ', 400, "not valid JSON", None),
    ('[1, 2]', 400, "JSON object", None),
    ('{"prompt": "hi"}', 400, "'model' is required", "model"),
    ('{"model": "llama"}', 400, "'prompt' is required", "prompt"),
    ('{"model": "llama", "prompt": "hi", "temperature": "hot"}', 400, "'temperature'", "temperature"),
    ('{"model": "llama", "prompt": "hi", "temperature": -1}', 400, "temperature must be", "temperature"),
    ('{"model": "llama", "prompt": "hi", "max_tokens": 0}', 400, "max_tokens must be", "max_tokens"),
    ('{"model": "llama", "prompt": "hi", "top_p": 2}', 400, "top_p must be", "top_p"),
    ('{"model": "llama", "prompt": "hi", "n": 0}', 400, "'n': Input should be greater than or equal to 1", "n"),
    ('{"model": "llama", "prompt": "hi", "n": 129}', 400, "'n': Input should be less than or equal to 128", "n"),
    ('{"model": "llama", "prompt": "hi", "best_of": 3}', 400, "'best_of' is not supported", "best_of"),
    ('{"model": "llama", "prompt": "hi", "echo": true}', 400, "'echo' is not supported", "echo"),
    ('{"model": "llama", "prompt": "hi", "frequency_penalty": 2.5}', 400, "frequency_penalty must be",
     "frequency_penalty"),
    ('{"model": "llama", "prompt": "hi", "repetition_penalty": 0}', 400, "repetition_penalty must be",
     "repetition_penalty"),
    ('{"model": "llama", "prompt": "hi", "logit_bias": {"x": 1}}', 400, "logit_bias keys must be", "logit_bias"),
    ('{"model": "llama", "prompt": "hi", "logit_bias": {"99999": 1}}', 400, "outside the vocabulary", "logit_bias"),
    ('{"model": "llama", "prompt": "hi", "min_tokens": 5, "max_tokens": 4}', 400, "min_tokens must be",
     "min_tokens"),
    ('{"model": "llama", "prompt": "hi", "stop_token_ids": [1, 99999]}', 400, "outside the vocabulary",
     "stop_token_ids"),
    ('{"model": "llama", "prompt": "hi", "tempurature": 0}', 400, "unknown field 'tempurature'", "tempurature"),
    ('{"model": "llama", "prompt": ["a", ""]}', 400, "'prompt.1' is empty", "prompt"),
    ('{"model": "llama", "prompt": ""}', 400, "'prompt' is empty", "prompt"),
    ('{"model": "llama", "prompt": [1, 99999]}', 400, "outside the vocabulary", None),
    ('{"model": "llama", "prompt": "hi", "logprobs": 50}', 400, "logprobs must be", "logprobs"),
    ('{"model": "gpt-9", "prompt": "hi"}', 404, "'gpt-9' does not exist", "model"),
])
def test_malformed_completion_requests(server, body, status, fragment, param):
    code, reply, _ = post(server, "/v1/completions", body)
    assert code == status, reply
    error = reply["error"]
    assert fragment in error["message"] and error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("body, fragment, param", [
    ('{"model": "llama", "messages": []}', "'messages'", "messages"),
    ('{"model": "llama", "messages": [{"role": "wizard", "content": "hi"}]}', "'messages.0.role'",
     "messages.0.role"),
    ('{"model": "llama", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}',
     "'tools.0.function'", "tools.0.function"),
    ('{"model": "llama", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}',
     "needs 'logprobs'", "top_logprobs"),
    ('{"model": "llama", "messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": true}}',
     "only allowed with stream", "stream_options"),
    ('{"model": "llama", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": [{"type": '
     '"text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}]}',
     "a part of type 'image_url' cannot be read", "messages.1.content"),
    ('{"model": "llama", "messages": [{"role": "user", "content": "hi"}], "store": true}',
     "'store' is not supported", "store"),
    ('{"model": "llama", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"}',
     "'reasoning_effort' is not supported", "reasoning_effort"),
    ('{"model": "llama", "messages": [{"role": "user", "content": "hi"}], "service_tier": "priority"}',
     "'service_tier' is not supported", "service_tier"),
])
def test_malformed_chat_requests(server, body, fragment, param):
    code, reply, _ = post(server, "/v1/chat/completions", body)
    assert code == 400, reply
    assert fragment in reply["error"]["message"] and reply["error"]["param"] == param


def test_errors_through_the_openai_client(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError, match=r"prompt of 601 tokens plus max_tokens=16 exceeds the "
                                                     r"context of 512 tokens") as caught:
        client.completions.create(model=MODEL, prompt="y" * 601, max_tokens=16)
    assert caught.value.code == "context_length_exceeded"
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    for other in ("nope", "org/nope"):
        with pytest.raises(openai.NotFoundError, match=f"the model '{other}' does not exist") as caught:
            client.models.retrieve(other)
        assert caught.value.code == "model_not_found"


def test_tokenize_and_detokenize_agree_with_what_the_endpoints_send(server, client, llm):
    code, got, _ = post(server, "/tokenize", json.dumps({"model": MODEL, "prompt": PROMPTS[2]}))
    assert code == 200 and got["tokens"] == llm.tokenize(PROMPTS[2]) and got["count"] == len(got["tokens"])
    assert got["max_model_len"] == client.models.retrieve(MODEL).model_extra["max_model_len"]

    messages = [{"role": "user", "content": "hello there"}]
    code, got, _ = post(server, "/tokenize", json.dumps({"model": MODEL, "messages": messages}))
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert code == 200 and got["tokens"] == chat_ids(llm, "hello there")
    assert got["count"] == answer.usage.prompt_tokens
    code, bare, _ = post(server, "/tokenize", json.dumps({"model": MODEL, "messages": messages,
                                                          "add_generation_prompt": False}))
    assert code == 200 and bare["count"] < got["count"]  # no '<assistant>' opened

    code, text, _ = post(server, "/detokenize", json.dumps({"model": MODEL, "tokens": llm.tokenize(PROMPTS[2])}))
    assert code == 200 and text["prompt"] == llm.tokenizer.decode(llm.tokenize(PROMPTS[2]))

    for path, body, fragment in [
            ("/tokenize", {"model": MODEL}, "give 'prompt' or 'messages'"),
            ("/tokenize", {"model": MODEL, "prompt": "a", "messages": messages}, "one of the two"),
            ("/detokenize", {"model": MODEL, "tokens": [1, 10 ** 9]}, "token id 1000000000 is outside"),
            ("/detokenize", {"model": "gpt-9", "tokens": [1]}, "'gpt-9' does not exist")]:
        code, reply, _ = post(server, path, json.dumps(body))
        assert code in (400, 404)
        assert_openai_error(reply, fragment)


def test_health_models_and_metrics(server):
    with urllib.request.urlopen(server.base + "/health", timeout=10) as reply:
        assert json.loads(reply.read()) == {"status": "ok"}
    with urllib.request.urlopen(server.base + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for name in ("requests_running", "requests_waiting", "kv_pages_used", "kv_pages_cached", "kv_pages_free",
                 "prefix_cache_hit_rate", "generation_tokens_total", "time_to_first_token_seconds",
                 "inter_token_latency_seconds", "request_latency_seconds", "preemptions_total"):
        assert f"# TYPE minisgl_{name} " in text
    assert "# TYPE minisgl_preemptions_total counter" in text
    assert 'minisgl_time_to_first_token_seconds_bucket{le="+Inf"}' in text
    code, _, _ = post(server, "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}))
    assert code == 200
    metrics = server.metrics()
    answered = sum(v for k, v in metrics.items() if k.startswith("requests_finished_total"))
    assert answered > 0 and metrics["request_latency_seconds_count"] == answered
    assert metrics["request_latency_seconds_sum"] >= metrics["time_to_first_token_seconds_sum"]


def stream_in_thread(base: str, prompt: str, max_tokens: int, results: list, started: threading.Event) -> threading.Thread:
    def run() -> None:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", timeout=WAIT_S, max_retries=0)
        text, reason = "", None
        for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}):
            started.set()
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        results.append((text, reason))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


DRAIN_S = 180


def test_full_queue_is_503_and_sigterm_answers_every_request(model_dir, tmp_path, llm):
    # a drain long enough for the paced 450 tokens on a machine busy with other work (they took over 30 s there)
    server = Server(model_dir, "--max-running", "1", "--max-queue", "1", "--shutdown-timeout", str(DRAIN_S),
                    log=tmp_path / "server.log", paced=True)
    try:
        results: list = []
        running, queued = threading.Event(), threading.Event()
        # long enough to be running still when the third request comes, on a slow machine too
        first = stream_in_thread(server.base, "first", 450, results, running)
        assert running.wait(WAIT_S)
        second = stream_in_thread(server.base, "second", 5, results, queued)
        metrics = server.wait_metrics(lambda m: m["requests_waiting"] == 1)
        assert metrics["requests_waiting"] == 1
        code, reply, headers = post(server, "/v1/completions", '{"model": "llama", "prompt": "third"}')
        assert code == 503 and "queue is full" in reply["error"]["message"]
        assert headers.get("Retry-After") == "1"
        code, reply, _ = post(server, "/v1/completions", '{"model": "llama", "prompt": "hi", "n": 2}')
        assert code == 400 and "asks for 2 choices" in reply["error"]["message"]  # never, however long it waits

        assert server.terminate(DRAIN_S + WAIT_S) == 0  # both requests in flight are answered before it exits
        first.join(WAIT_S)
        second.join(WAIT_S)
        expected = llm.generate(["first", "second"], [greedy(450), greedy(5)])
        assert sorted(results) == sorted((want["text"], "length") for want in expected)
        assert "Traceback" not in server.log()
        # one whole line, as a log keeps it (the server's stderr is no terminal and has no width here)
        assert (f"minisgl: shutting down; finishing 2 responses (up to {DRAIN_S} s; Ctrl-C again to stop at once)"
                in server.log().splitlines())
    finally:
        server.stop()


def test_trace_out_keeps_the_step_events_and_stopping_counts_the_requests_answered(model_dir, tmp_path):
    trace = tmp_path / "steps.jsonl"
    server = Server(model_dir, "--trace", "--trace-out", str(trace), log=tmp_path / "server.log")
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", timeout=WAIT_S, max_retries=0)
        client.completions.create(model=MODEL, prompt="trace me", max_tokens=4, temperature=0,
                                  extra_body={"ignore_eos": True})
        assert server.terminate() == 0
    finally:
        server.stop()
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["options"]["source"] == "serve"
    events = [line for line in lines if line["type"] == "step"]
    assert [e["phase"] for e in events] == ["prefill", "decode", "decode", "decode"]
    assert events[0]["arrived"] == [0] and events[-1]["finished"] == [0]
    assert "1/1 request finished" in server.log()
    assert "minisgl stopped: 1 request answered" in server.log()  # the last line, in words
    replayed = read_trace(trace)  # the server's trace replays like a command's, each client request by uid
    assert replayed.header.prompts == ("request uid0",) and len(replayed.events) == 4


def test_unknown_routes_and_methods_answer_in_openai_shape(server):
    code, reply, _ = request(server, "GET", "/v1/nowhere")
    assert code == 404
    assert_openai_error(reply, "no route GET /v1/nowhere")
    code, reply, headers = request(server, "GET", "/v1/completions")
    assert code == 405 and "POST" in headers["Allow"]
    assert_openai_error(reply, "method GET is not allowed on /v1/completions; use POST")
    for path in ("/dashboard", "/dashboard/events"):  # a server started without --dashboard says how to get one
        code, reply, _ = request(server, "GET", path)
        assert code == 404
        assert_openai_error(reply, "start the server with --dashboard")


def test_an_empty_body_is_said_to_be_empty(server):
    code, reply, _ = post(server, "/v1/completions", b"")
    assert code == 400
    assert_openai_error(reply, "the request body is empty; it must be a JSON object")


def test_a_json_body_without_a_content_type_is_read_as_json(server):
    import http.client

    body = json.dumps({"model": MODEL, "prompt": "hello there", "max_tokens": 3, "temperature": 0}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT_S)
    connection.putrequest("POST", "/v1/completions")  # no Content-Type header at all
    connection.putheader("Content-Length", str(len(body)))
    connection.endheaders(body)
    reply = connection.getresponse()
    assert reply.status == 200, reply.read()
    assert json.loads(reply.read())["usage"]["completion_tokens"] <= 3
    connection.close()
    # urllib, like curl -d, labels any body a form: read as JSON too
    code, reply, _ = request(server, "POST", "/v1/completions", body)
    assert code == 200, reply
    code, reply, _ = request(server, "POST", "/v1/completions", body, {"Content-Type": "text/plain"})
    assert code == 400
    assert_openai_error(reply, "Content-Type: application/json")


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": "5"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": "5"}),
])
def test_a_token_count_given_as_a_string_is_refused(server, path, body):
    field = next(name for name in body if name.startswith("max_"))
    code, reply, _ = post(server, path, json.dumps({"model": MODEL, **body}))
    assert code == 400, reply
    assert_openai_error(reply, f"'{field}'")
    assert reply["error"]["param"] == field


class Pet(pydantic.BaseModel):
    """A reply's shape for structured output: bounded, so random weights at temperature 1 still end it."""

    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=6)
    kind: Literal["cat", "dog"]
    age: int = pydantic.Field(ge=0, le=30)


def test_response_format_with_a_pydantic_model_parses_at_temperature_1(client):
    """The openai client's parse(): the schema goes as response_format json_schema (strict), and every reply,
    over several seeds and streamed or not, is a Pet."""
    for seed in range(4):
        reply = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "a pet"}],
                                              response_format=Pet, temperature=1.0, seed=seed, max_tokens=80, n=2)
        assert all(isinstance(c.message.parsed, Pet) and c.finish_reason == "stop" for c in reply.choices), reply
    with client.chat.completions.stream(model=MODEL, messages=[{"role": "user", "content": "a pet"}],
                                        response_format=Pet, temperature=1.0, seed=7, max_tokens=80) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Pet)


def test_json_object_and_structured_outputs_on_completions_and_chat(client):
    """json_object gives an object; vLLM's structured_outputs (json, regex, choice, grammar) their match, n=4
    choices each sampled with its own seed; a reply cut by max_tokens says 'length'."""
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "{"}], max_tokens=64,
                                          response_format={"type": "json_object"}, temperature=1.0, seed=3, n=4)
    assert all(c.finish_reason == "length" or isinstance(json.loads(c.message.content), dict) for c in chat.choices)
    asks = {"json": Pet.model_json_schema(), "regex": "[A-Z]{2}-[0-9]{3}", "choice": ["yes", "no"],
            "grammar": 'start: "go " ("left" | "right")'}
    for name, value in asks.items():
        got = client.completions.create(model=MODEL, prompt="x", max_tokens=80, temperature=1.0, seed=5, n=4,
                                        extra_body={"structured_outputs": {name: value}})
        texts = [c.text for c in got.choices]
        assert all(c.finish_reason == "stop" for c in got.choices), got
        if name == "json":
            [Pet.model_validate_json(t) for t in texts]
        elif name == "choice":
            assert set(texts) <= {"yes", "no"}
        else:
            pattern = value if name == "regex" else "go (left|right)"
            assert all(re.fullmatch(pattern, t) for t in texts), texts
    cut = client.completions.create(model=MODEL, prompt="x", max_tokens=3,
                                    extra_body={"structured_outputs": {"regex": "[0-9]{10}"}})
    assert (len(cut.choices[0].text), cut.choices[0].finish_reason) == (3, "length")


@pytest.mark.parametrize("body, fragment, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "Invalid type: objekt", "response_format"),
    ({"structured_outputs": {"regex": "[0-9"}}, "unclosed character class", "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one of", "structured_outputs"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "not both",
     "structured_outputs"),
])
def test_a_bad_constraint_is_a_400_naming_it(server, body, fragment, param):
    code, reply, _ = post(server, "/v1/chat/completions", json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}))
    assert code == 400, reply
    assert_openai_error(reply, fragment)
    assert reply["error"]["param"] == param


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "additionalProperties": False,
                                                           "properties": {"city": {"type": "string", "maxLength": 8},
                                                                          "unit": {"enum": ["c", "f"]}},
                                                           "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["a", "b"],
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "maximum": 9}}}}}
ASK = [{"role": "user", "content": "weather in Paris?"}]


def assert_calls_validate(calls) -> None:
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in (WEATHER, ADD)}
    assert calls, "no tool call"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in schemas
        arguments = json.loads(call.function.arguments)
        assert set(arguments) == set(schemas[call.function.name]["required"]), arguments
        if call.function.name == "add":
            assert 0 <= arguments["a"] <= 99 and arguments["b"] <= 9
        else:
            assert len(arguments["city"]) <= 8 and arguments["unit"] in ("c", "f")


def test_a_forced_tool_call_validates_streamed_or_not(client):
    """tool_choice required (and a named function): at temperature 1 over several seeds, every reply is a call
    whose arguments match its function's schema, finish_reason tool_calls; streamed, the openai client joins the
    deltas into the same kind of call."""
    for seed in range(3):
        reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, ADD], tool_choice="required",
                                               parallel_tool_calls=False, temperature=1.0, seed=seed, n=2,
                                               max_tokens=100)
        for choice in reply.choices:
            assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
            assert_calls_validate(choice.message.tool_calls)
    named = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, ADD], temperature=1.0, seed=4,
                                           tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=60)
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["add"]
    assert_calls_validate(named.choices[0].message.tool_calls)
    for seed in range(2):
        with client.chat.completions.stream(model=MODEL, messages=ASK, tools=[WEATHER, ADD], tool_choice="required",
                                            parallel_tool_calls=False, temperature=1.0, seed=seed,
                                            max_tokens=100) as stream:
            final = stream.get_final_completion()
        assert final.choices[0].finish_reason == "tool_calls"
        assert_calls_validate(final.choices[0].message.tool_calls)
    # the call and its result go back through the chat template
    call = named.choices[0].message.tool_calls[0]
    after = client.chat.completions.create(model=MODEL, tools=[WEATHER, ADD], tool_choice="none", max_tokens=4,
                                           messages=ASK + [{"role": "assistant", "content": None,
                                                            "tool_calls": [call.model_dump()]},
                                                           {"role": "tool", "tool_call_id": call.id, "content": "7"}])
    assert after.choices[0].message.tool_calls is None and after.usage.prompt_tokens > 20


@pytest.mark.parametrize("extra, fragment", [
    ({}, "needs a chat template that knows tools"),  # auto, the default: this template has no tools
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope', which is not among the tools"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot also follow"),
])
def test_tools_that_cannot_be_honoured_are_a_400(server, extra, fragment):
    code, reply, _ = post(server, "/v1/chat/completions", json.dumps(
        {"model": MODEL, "messages": ASK, "tools": [WEATHER], **extra}))
    assert code == 400, reply
    assert_openai_error(reply, fragment)
