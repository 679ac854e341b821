"""The server's log: request ids, ``--log-requests`` and ``--log-stats``; a real server process, the official
openai client and raw HTTP. The server is the keyed one of tests/server/conftest.py, so every request here carries
its key.

Every response carries ``X-Request-Id`` (the client's own when it sent a usable one, else a new one), errors
included, and the openai client reads it; each /v1/ request's log line names that id with the token counts and
finish reason the client was answered with, and never the prompt or the completion. While requests run, the
stats line comes every interval, and an idle server stops writing it.
"""

from __future__ import annotations

import json
import re
import socket
import time

import openai
import pytest

from core import LLM, SamplingParams
from tests.server.conftest import STATS_EVERY_S
from tests.support.serve import WAIT_S, Server, request

MODEL = "llama"  # the served name: the test checkpoint's directory
PROMPT = "The quick brown fox jumps"
MADE_ID = re.compile(r"req-[0-9a-f]{32}")
STATS = re.compile(r"minisgl: prompt ([\d,]+) tok/s, generation ([\d,]+) tok/s, [\d.]+ requests/s answered; "
                   r"running \d+, waiting \d+, preempted \d+ so far; KV cache \d+% used \(\d+% prefix cache\), prefix hits \d+%")


@pytest.fixture(scope="module")
def model_dir(model_dirs):
    return model_dirs["llama"]


@pytest.fixture(scope="module")
def server(keyed_server):
    """tests/server/conftest.py's, with --log-requests and --log-stats STATS_EVERY_S."""
    return keyed_server


@pytest.fixture(scope="module")
def client(server, api_key):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=api_key, timeout=WAIT_S, max_retries=0)


@pytest.fixture(scope="module")
def auth(api_key) -> dict[str, str]:
    """The header that carries the key, for the requests sent without the openai client."""
    return {"Authorization": f"Bearer {api_key}"}


def header_lines(headers: dict[str, str]) -> bytes:
    return b"".join(f"{name}: {value}\r\n".encode() for name, value in headers.items())


def log_line(server: Server, request_id: str) -> dict[str, str]:
    """The server's line for one request, as its fields (the first six by name), once it is written."""
    deadline = time.monotonic() + WAIT_S
    while True:
        lines = [line for line in server.log().splitlines() if f" {request_id} " in line]
        if lines or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(lines) == 1, server.log()
    stamp, rid, client, method, path, status, rest = (lines[0].split(" ", 6) + [""])[:7]
    fields = dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', rest))
    return {"stamp": stamp, "id": rid, "client": client, "method": method, "path": path, "status": status,
            **fields}


def test_the_clients_id_comes_back_and_its_log_line_says_what_it_was_answered(client, server, model_dir):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=PROMPT, max_tokens=7, temperature=0,
                                                      extra_body={"ignore_eos": True},
                                                      extra_headers={"X-Request-Id": "trace-42/a"})
    reply = raw.parse()
    assert raw.headers["x-request-id"] == "trace-42/a" and reply._request_id == "trace-42/a"
    want = LLM(str(model_dir)).generate([PROMPT], SamplingParams(max_tokens=7, ignore_eos=True))[0]
    assert reply.choices[0].text == want["text"]

    line = log_line(server, "trace-42/a")
    assert (line["client"], line["method"], line["path"], line["status"]) == ("127.0.0.1", "POST",
                                                                              "/v1/completions", "200")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["stamp"])
    assert int(line["prompt_tokens"]) == reply.usage.prompt_tokens == want["prompt_tokens"]
    assert int(line["completion_tokens"]) == reply.usage.completion_tokens == 7
    assert line["finish_reason"] == "length" and int(line["uid"]) >= 0
    assert 0 < float(line["ttft_ms"]) <= float(line["total_ms"])
    assert PROMPT not in server.log() and want["text"].strip() not in server.log()


def test_without_an_id_each_response_gets_a_new_one_streams_too(client, server):
    ids = []
    for _ in range(2):
        raw = client.completions.with_raw_response.create(model=MODEL, prompt="a", max_tokens=2)
        ids.append(raw.headers["x-request-id"])
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=9, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    ids.append(stream.response.headers["x-request-id"])
    assert all(MADE_ID.fullmatch(i) for i in ids) and len(set(ids)) == 3

    line = log_line(server, ids[-1])
    assert line["status"] == "200" and line["finish_reason"] == "length"
    assert int(line["completion_tokens"]) == chunks[-1].usage.completion_tokens == 9
    assert float(line["ttft_ms"]) < float(line["total_ms"])


def test_a_request_of_several_choices_is_one_line_naming_each(client, server):
    reply = client.completions.create(model=MODEL, prompt=PROMPT, n=2, max_tokens=3, temperature=0,
                                      extra_body={"ignore_eos": True}, extra_headers={"X-Request-Id": "two-1"})
    line = log_line(server, "two-1")
    uids = [int(uid) for uid in line["uid"].split(",")]
    assert len(set(uids)) == 2 and line["finish_reason"] == "length,length"
    assert int(line["completion_tokens"]) == reply.usage.completion_tokens == 6


def test_errors_carry_the_id_and_their_log_line_says_why(client, server, auth):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"best_of": 2},
                                  extra_headers={"X-Request-Id": "bad-1"})
    assert caught.value.request_id == "bad-1"
    line = log_line(server, "bad-1")
    assert line["status"] == "400" and "best_of" in json.loads(line["error"])
    assert "prompt_tokens" not in line and "uid" not in line  # refused before the engine saw it

    code, _, headers = request(server, "GET", "/v1/nowhere", headers={"X-Request-Id": "lost-1", **auth})
    assert code == 404 and headers["X-Request-Id"] == "lost-1"
    assert log_line(server, "lost-1")["status"] == "404"


@pytest.mark.parametrize("sent", ["x" * 129, "two words", "caf\u00e9", ""])
def test_an_id_that_is_not_a_short_run_of_visible_ascii_is_replaced(server, auth, sent):
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    with raw:
        raw.sendall(b"GET /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + header_lines(auth)
                    + b"X-Request-Id: " + sent.encode() + b"\r\n\r\n")
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    assert head.startswith("HTTP/1.1 200")
    given = re.search(r"(?im)^x-request-id: ([^\r\n]*)", head).group(1)
    assert MADE_ID.fullmatch(given), head


def test_a_client_that_leaves_mid_stream_is_logged_as_aborted(server, auth):
    rid = "gone-1"
    body = json.dumps({"model": MODEL, "prompt": "long", "max_tokens": 400, "stream": True,
                       "ignore_eos": True}).encode()
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    with raw:
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                    + header_lines(auth) + b"X-Request-Id: " + rid.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
                    + b"\r\n\r\n" + body)
        seen = b""
        while seen.count(b"data: ") < 3:
            seen += raw.recv(65536)
    line = log_line(server, rid)
    assert line["status"] == "200" and line["finish_reason"] == "abort"
    assert 0 < int(line["completion_tokens"]) < 400


def test_health_and_metrics_are_not_logged(server, auth):
    request(server, "GET", "/health", headers={"X-Request-Id": "probe-1"})
    code, _, headers = request(server, "GET", "/health", headers={"X-Request-Id": "probe-2"})
    assert code == 200 and headers["X-Request-Id"] == "probe-2"
    request(server, "GET", "/v1/models", headers={"X-Request-Id": "after-probes", **auth})
    log_line(server, "after-probes")  # written: any line for the probes would be there by now
    assert "probe-1" not in server.log() and "probe-2" not in server.log()


def stats_lines(server: Server) -> list[re.Match]:
    return [m for line in server.log().splitlines() if (m := STATS.fullmatch(line))]


def test_the_stats_line_comes_while_requests_run_and_stops_when_idle(client, server):
    time.sleep(4 * STATS_EVERY_S)  # whatever ran before has had its last line
    before = len(stats_lines(server))
    client.completions.create(model=MODEL, prompt="long", max_tokens=300, temperature=0,
                              extra_body={"ignore_eos": True})
    time.sleep(4 * STATS_EVERY_S)
    lines = stats_lines(server)[before:]
    assert any(int(m.group(2).replace(",", "")) > 0 for m in lines), server.log()[-2000:]
    assert lines[-1].group(2) == "0"  # the line after the last request
    idle = len(stats_lines(server))
    time.sleep(4 * STATS_EVERY_S)
    assert len(stats_lines(server)) == idle  # nothing while idle


def test_the_ready_line_follows_the_load_line(server, model_dir):
    lines = server.log().splitlines()
    ready = next(i for i, line in enumerate(lines) if line.startswith("engine ready"))
    assert lines[ready - 1].startswith(f"loading {model_dir}: done in "), "\n".join(lines[:ready + 1])
