"""Hostile clients against a real server (docs/RELIABILITY.md): each gets a 4xx in OpenAI's error shape within a
second or two, no traceback, while another client's stream goes on at its pace; the server is healthy after.

Requests are written on raw sockets, byte for byte: an HTTP library would refuse to send most of them.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass

import openai

from tests.server.conftest import MAX_CONNECTIONS, MODEL, READ_TIMEOUT_S
from tests.support.serve import Server

ANSWER_S = 2.0  # "within a second or two"
MAX_GAP_S = 1.5  # the longest a concurrent stream may wait between two chunks
MAX_BODY = 8 * 1024 * 1024  # --max-body-bytes' default, which the shared server keeps


def http(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Length": str(len(body)),
            **(headers or {})}
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n").encode(
        "latin-1") + body


def completion(**fields) -> bytes:
    return http("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", **fields}).encode())


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: dict
    seconds: float


def exchange(server: Server, data: bytes, pause_s: float = 0.0) -> Answer:
    """``data`` written (all of it, or until the server closes), then the response read whole."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):  # the server answered before the rest was sent
            pass
        time.sleep(pause_s)
        raw = b""
        while b"\r\n\r\n" not in raw or len(raw.split(b"\r\n\r\n", 1)[1]) < length_of(raw):
            chunk = sock.recv(65536)
            if not chunk:
                break
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return Answer(int(lines[0].split()[1]), headers, json.loads(body or b"{}"), time.monotonic() - start)


def length_of(raw: bytes) -> int:
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    return next((int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.startswith("content-length:")),
                0)


class Pace:
    """Streams completions one after another on a thread, and keeps the longest wait between two chunks (the
    first chunk's wait from the request included)."""

    def __init__(self, server: Server) -> None:
        self.client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", timeout=30, max_retries=0)
        self.longest_gap, self.chunks, self.streams = 0.0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            last = time.monotonic()
            for chunk in self.client.completions.create(model=MODEL, prompt="pace", max_tokens=200, stream=True,
                                                        extra_body={"ignore_eos": True}):
                now = time.monotonic()
                self.longest_gap, self.chunks, last = max(self.longest_gap, now - last), self.chunks + 1, now
            self.streams += 1

    def __enter__(self) -> "Pace":
        self._thread.start()
        while self.chunks == 0:
            time.sleep(0.01)
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(30)


CASES = {  # name -> (the request, its status, a fragment of its message)
    "invalid UTF-8": (http("POST", "/v1/completions", b'{"model": "llama", "prompt": "\xff\xfe"}'), 400,
                      "not valid UTF-8"),
    "JSON nested 100,000 deep": (http("POST", "/v1/completions", b"[" * 100_000 + b"]" * 100_000), 400,
                                 "nested too deeply"),
    "NaN": (http("POST", "/v1/completions", b'{"model": "llama", "prompt": "hi", "temperature": NaN}'), 400,
            "'temperature': Input should be a finite number"),
    "Infinity": (http("POST", "/v1/completions", b'{"model": "llama", "prompt": "hi", "top_p": Infinity}'), 400,
                 "'top_p': Input should be a finite number"),
    "1e999": (http("POST", "/v1/completions", b'{"model": "llama", "prompt": "hi", "temperature": 1e999}'), 400,
              "finite number"),
    "n of a billion": (completion(n=10**9), 400, "'n'"),
    "max_tokens of 10^20": (completion(max_tokens=10**20), 400, "exceeds the context"),
    "top_k of 10^20": (completion(top_k=10**20), 400, "'top_k' is out of range"),
    "a prompt of a million ids": (completion(prompt=[1] * 1_000_000), 400, "exceeds the context"),
    "a 100,000-character model name": (completion(model="m" * 100_000), 404, "(100,000 characters)"),
    "a message of 100,000 parts": (http("POST", "/v1/chat/completions", json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 100_000}]}
    ).encode()), 400, "at most 4,096 content parts, got 100,000"),
    "a header with a bare LF": (http("GET", "/health", headers={"X-Request-Id": "a\nX-Injected: 1"}), 400,
                                "not valid HTTP/1.1"),
    "a header with a bare CR": (http("GET", "/health", headers={"X-Request-Id": "a\rX-Injected: 1"}), 400,
                                "not valid HTTP/1.1"),
    "/dashboard/../..": (http("GET", "/dashboard/../../etc/passwd"), 404, "--dashboard"),
    "%2e%2e": (http("GET", "/dashboard/%2e%2e/%2e%2e/etc/passwd"), 404, "--dashboard"),
    "a Content-Length over the limit": (http("POST", "/v1/completions", headers={
        "Content-Length": str(MAX_BODY + 1)}), 413, "--max-body-bytes"),
    "a chunked body over the limit": (http("POST", "/v1/completions", headers={
        "Transfer-Encoding": "chunked", "Content-Length": None}).replace(b"Content-Length: None\r\n", b"") +
        (b"100000\r\n" + b" " * 0x100000 + b"\r\n") * 9, 413, "--max-body-bytes"),
    "headers of 100,000 bytes": (http("GET", "/health", headers={"X-Big": "b" * 100_000}), 431, "headers"),
}


def check(name: str, answer: Answer, status: int, fragment: str, within_s: float) -> list[str]:
    error = answer.body.get("error", {})
    wrong = []
    if answer.status != status or fragment not in error.get("message", ""):
        wrong.append(f"{name}: {answer.status} {answer.body}")
    if set(answer.body) != {"error"} or set(error) != {"message", "type", "param", "code"}:
        wrong.append(f"{name}: not OpenAI's error shape: {answer.body}")
    if answer.seconds > within_s:
        wrong.append(f"{name}: answered in {answer.seconds:.2f} s")
    if any(name.startswith("x-injected") for name in answer.headers):
        wrong.append(f"{name}: a header was reflected")
    return wrong


def slow_clients(server: Server) -> dict[str, Answer]:
    """Three clients at once that never finish sending: nothing, half the headers, half the body."""
    requests = {"silent": b"", "half the headers": b"GET /health HTTP/1.1\r\nHo",
                "half the body": http("POST", "/v1/completions", b'{"model": "llama"', {"Content-Length": "50"})}
    answers: dict[str, Answer] = {}
    threads = [threading.Thread(target=lambda n=name, d=data: answers.update({n: exchange(server, d)}))
               for name, data in requests.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(READ_TIMEOUT_S + 10)
    return answers


def connections_to_the_limit(server: Server) -> tuple[Answer, Answer]:
    """MAX_CONNECTIONS connections held open: the first request's answer, and that of one more connection's."""
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(MAX_CONNECTIONS)]
    try:
        first = exchange_on(held[0], http("GET", "/health"))
        return first, exchange(server, http("GET", "/health"))
    finally:
        for sock in held:
            sock.close()


def exchange_on(sock: socket.socket, data: bytes) -> Answer:
    start = time.monotonic()
    sock.sendall(data)
    raw = b""
    while b"\r\n\r\n" not in raw or len(raw.split(b"\r\n\r\n", 1)[1]) < length_of(raw):
        raw += sock.recv(65536)
    status = int(raw.split(b" ", 2)[1])
    return Answer(status, {}, json.loads(raw.split(b"\r\n\r\n", 1)[1]), time.monotonic() - start)


def test_hostile_clients_get_a_4xx_at_once_while_a_stream_keeps_its_pace(api_server):
    server = api_server
    wrong: list[str] = []
    with Pace(server) as pace:
        for name, (data, status, fragment) in CASES.items():
            wrong += check(name, exchange(server, data), status, fragment, ANSWER_S)
        for name, answer in slow_clients(server).items():
            wrong += check(f"a client that sends {name}", answer, 408, "--read-timeout", READ_TIMEOUT_S + ANSWER_S)
        split = exchange(server, http("GET", "/health", headers={"X-Request-Id": "a\r\nX-Injected: 1"}))
        assert split.status == 200 and split.headers["x-request-id"] == "a" and "x-injected" not in split.headers
        first, beyond = connections_to_the_limit(server)
        assert first.status == 200
        wrong += check("a connection beyond the limit", beyond, 503, "--max-connections", ANSWER_S)
    assert not wrong, "\n".join(wrong)
    assert pace.longest_gap < MAX_GAP_S and pace.chunks > 10, (pace.longest_gap, pace.chunks)
    assert exchange(server, http("GET", "/health")).body == {"status": "ok"}
    assert "Traceback" not in server.log()
