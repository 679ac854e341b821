"""``minisgl serve --api-key``: a real server process, the official openai client and ``minisgl bench --serve --url``.

With the key, the answers are the engine's (equal to LLM.generate); without it, or with another, every /v1/
path is a 401 in OpenAI's shape that never echoes what was sent; /health and /metrics stay open and count the
refusals; the load generator sends the key when given it and says in one line that the server wants one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from core import LLM, SamplingParams
from tests.support.serve import WAIT_S, Server, assert_openai_error, request

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama"  # the served name: the test checkpoint's directory
WRONG = "sk-wrong-key-4567"


@pytest.fixture(scope="module")
def model_dir(model_dirs):
    return model_dirs["llama"]


@pytest.fixture(scope="module")
def server(keyed_server):
    """tests/server/conftest.py's, shared with test_cors.py: the model's defaults overridden, greedy and 5 tokens
    for requests that leave them out (a request that gives them, as the others here do, is not touched)."""
    return keyed_server


def client(server: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base + "/v1", api_key=key, timeout=WAIT_S, max_retries=0)


def test_the_key_opens_the_api_and_the_answers_are_the_engines(server, api_key, model_dir):
    reply = client(server, api_key).completions.create(model=MODEL, prompt="hello there", max_tokens=6,
                                                       temperature=0, extra_body={"ignore_eos": True})
    expected = LLM(str(model_dir)).generate(["hello there"], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    assert reply.choices[0].text == expected["text"]
    assert [m.id for m in client(server, api_key).models.list().data] == [MODEL]


def test_the_overridden_defaults_apply_where_a_request_leaves_a_field_out(server, api_key, model_dir):
    assert "sampling defaults: temperature 0, max_tokens 5 (from the override)" in server.log()
    api, llm = client(server, api_key), LLM(str(model_dir))
    left_out = api.completions.create(model=MODEL, prompt="hello there", extra_body={"ignore_eos": True})
    greedy = llm.generate(["hello there"], SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert left_out.choices[0].text == greedy["text"] and left_out.usage.completion_tokens == 5
    given = api.completions.create(model=MODEL, prompt="hello there", max_tokens=7, temperature=1.0, seed=11,
                                   extra_body={"ignore_eos": True})
    sampled = llm.generate(["hello there"], SamplingParams(max_tokens=7, temperature=1.0, seed=11, ignore_eos=True))
    assert given.choices[0].text == sampled[0]["text"] and given.usage.completion_tokens == 7
    assert sampled[0]["token_ids"][:5] != greedy["token_ids"]  # the draw is no greedy one: the default stayed out


def test_another_key_or_none_is_a_401_in_openai_shape_that_never_echoes_it(server, api_key):
    before = server.metrics().get('http_errors_total{status="401"}', 0.0)
    with pytest.raises(openai.AuthenticationError, match="incorrect API key") as caught:
        client(server, WRONG).completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert caught.value.code == "invalid_api_key" and WRONG not in str(caught.value)
    assert caught.value.request_id.startswith("req-")  # a refusal names its request like any answer
    code, reply, headers = request(server, "POST", "/v1/completions",
                                   json.dumps({"model": MODEL, "prompt": "hi"}).encode())
    assert code == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert_openai_error(reply, "Authorization: Bearer")
    code, reply, _ = request(server, "GET", "/v1/nowhere", headers={"Authorization": f"Basic {api_key}"})
    assert code == 401  # guarded before routing: a refusal says nothing about which paths exist
    assert_openai_error(reply, "no API key")
    code, _, _ = request(server, "POST", "/tokenize", json.dumps({"model": MODEL, "prompt": "hi"}).encode())
    assert code == 401  # the tokenizer's endpoints are the API's too
    after = server.wait_metrics(lambda m: m.get('http_errors_total{status="401"}', 0.0) >= before + 4)
    assert after['http_errors_total{status="401"}'] == before + 4


def test_health_and_metrics_stay_open(server):
    with urllib.request.urlopen(server.base + "/health", timeout=10) as reply:
        assert json.loads(reply.read()) == {"status": "ok"}
    assert "requests_running" in server.metrics()


def bench(server: Server, model_dir: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minisgl_cli", "bench", "--serve", "--url", server.base + "/v1",
                           "--model", str(model_dir), "--requests", "3", "--skip-offline", "--json", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)


def test_bench_serve_sends_the_key_and_says_when_the_server_wants_one(server, api_key, model_dir):
    with ThreadPoolExecutor(2) as pool:  # side by side: each process spends most of its time importing
        done, refused = pool.map(lambda extra: bench(server, model_dir, *extra), [("--api-key", api_key), ()])
    assert done.returncode == 0, done.stderr
    rates = json.loads(done.stdout)["rates"]
    assert [(r["completed"], r["failed"]) for r in rates] == [(3, 0)]
    assert refused.returncode == 2 and refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert "Traceback" not in refused.stderr
    assert lines[-1].startswith("error: the server at ") and lines[-1].endswith("give its key with --api-key")
    assert "HTTP 401" in lines[-1]


@pytest.mark.parametrize("key", ["", "two words"])
def test_a_key_that_no_header_could_carry_is_a_usage_error_before_the_model_loads(model_dir, key):
    done = subprocess.run([sys.executable, "-m", "minisgl_cli", "serve", "--model", str(model_dir), "--port", "0",
                           "--api-key", key], cwd=ROOT, capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'--api-key'" in lines[0] and "without spaces" in lines[0], done.stderr
    assert "loading" not in done.stderr
