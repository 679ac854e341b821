"""The engine in a process of its own, seen from outside: a real ``minisgl serve`` and real sockets.

What happens when the engine process dies, when the server is told to stop (SIGTERM, Ctrl-C twice) and when it
is killed outright: every open stream ends properly, nothing hangs, no engine process is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.support.serve import Server

WAIT_S = 60.0


@pytest.fixture(scope="module")
def model_dir(model_dirs):
    return model_dirs["llama"]


def engine_pid(server: Server) -> int:
    return _engines(server)[0]["pid"]


def gone(pid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) counts as gone
            if f.read().split(")")[-1].split()[0] == "Z":
                return True
        time.sleep(0.1)
    return False


class Stream:
    """A streamed completion read on a thread: every SSE data line, in order."""

    def __init__(self, base: str, max_tokens: int) -> None:
        self.lines: list[str] = []
        self.first = threading.Event()
        body = json.dumps({"model": "llama", "prompt": "hello", "max_tokens": max_tokens, "stream": True,
                           "ignore_eos": True}).encode()
        self._request = urllib.request.Request(base + "/v1/completions", body,
                                               {"Content-Type": "application/json"})
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with urllib.request.urlopen(self._request, timeout=WAIT_S) as reply:
            for raw in reply:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    self.lines.append(line[6:])
                    self.first.set()

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.lines if line != "[DONE]"]


def test_a_dead_engine_ends_every_stream_with_an_error_and_the_server_exits_1(model_dir, tmp_path):
    server = Server(model_dir, "--max-running", "4", log=tmp_path / "server.log", paced=True)
    try:
        pid = engine_pid(server)
        stream = Stream(server.base, 500)
        assert stream.first.wait(WAIT_S)
        os.kill(pid, signal.SIGKILL)
        stream.thread.join(WAIT_S)
        assert not stream.thread.is_alive(), "the stream hung after the engine died"
        assert stream.lines[-1] == "[DONE]"
        assert "error" in stream.events()[-1] and "engine" in stream.events()[-1]["error"]["message"]
        # while it winds down, new requests are refused in OpenAI's error shape and /health fails
        request = urllib.request.Request(server.base + "/v1/completions",
                                         json.dumps({"model": "llama", "prompt": "hi"}).encode(),
                                         {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("a request was answered with no engine")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and "engine" in json.loads(exc.read())["error"]["message"]
        except urllib.error.URLError:
            pass  # already gone: refused, never hung
        assert server.proc.wait(WAIT_S) == 1
        log = server.log()
        assert f"engine process (pid {pid}) died" in log and "Traceback" not in log
    finally:
        server.stop()


def test_sigterm_finishes_or_aborts_every_stream_with_a_last_chunk_and_done(model_dir, tmp_path):
    server = Server(model_dir, "--max-running", "4", "--shutdown-timeout", "0.2", log=tmp_path / "server.log",
                    paced=True)
    try:
        streams = [Stream(server.base, 500) for _ in range(3)]
        assert all(s.first.wait(WAIT_S) for s in streams)
        pid = engine_pid(server)
        assert server.terminate() == 0
        for stream in streams:
            stream.thread.join(WAIT_S)
            assert stream.lines[-1] == "[DONE]"
            assert stream.events()[-1]["choices"][0]["finish_reason"] in ("abort", "length")  # cut, or done
        log = server.log()
        assert "finishing 3 responses" in log and "Traceback" not in log
        assert gone(pid)
    finally:
        server.stop()


def test_a_second_ctrl_c_stops_at_once_with_130(model_dir, tmp_path):
    server = Server(model_dir, "--max-running", "4", "--shutdown-timeout", "60", log=tmp_path / "server.log",
                    paced=True)
    try:
        stream = Stream(server.base, 500)
        assert stream.first.wait(WAIT_S)
        pid = engine_pid(server)
        server.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + WAIT_S  # the second Ctrl-C while the drain runs, not after the stream ended
        while "shutting down" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert stream.thread.is_alive(), "the stream ended before the second Ctrl-C: nothing was left to stop"
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(WAIT_S) == 130
        assert gone(pid)
        assert "Traceback" not in server.log()
    finally:
        server.stop()


def test_a_port_in_use_is_a_usage_error_before_the_model_loads(model_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "minisgl_cli", "serve", "--model", str(model_dir),
                                 "--port", str(port)], capture_output=True, text=True, timeout=WAIT_S)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot listen on 127.0.0.1:") and "minisgl serving" \
        not in result.stderr
    assert time.monotonic() - started < WAIT_S


@pytest.fixture(scope="module")
def two_engines(model_dir, tmp_path_factory):
    """A server of two engine processes (--dp 2), for the two tests below (a start costs a model load each): the
    second kills it."""
    server = Server(model_dir, "--dp", "2", log=tmp_path_factory.mktemp("serve-dp") / "server.log")
    yield server
    server.stop()


def test_two_engines_answer_token_exact_and_shared_prefixes_land_together(model_dir, two_engines):
    import openai

    from core import LLM, SamplingParams

    groups = [[list(range(1, 40)) + [50 + i] for i in range(3)],  # three prompts sharing 39 tokens
              [list(range(100, 140)) + [60 + i] for i in range(3)]]  # three sharing another 40
    expected = LLM(str(model_dir)).generate([p for g in groups for p in g],
                                            SamplingParams(max_tokens=6, ignore_eos=True))
    server = two_engines
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none")
    placed_in = []
    for n, prompt in enumerate(p for g in groups for p in g):
        before = [e["requests"] for e in _engines(server)]
        reply = client.completions.create(model="llama", prompt=prompt, max_tokens=6, temperature=0,
                                          extra_body={"ignore_eos": True})
        after = [e["requests"] for e in _engines(server)]
        placed_in.append([b != a for b, a in zip(before, after)].index(True))
        assert reply.choices[0].text == expected[n]["text"]
    assert len({e["pid"] for e in _engines(server)}) == 2
    assert len(set(placed_in[:3])) == 1 and len(set(placed_in[3:])) == 1  # each group on one engine
    assert placed_in[0] != placed_in[3]  # the second group, matching nothing, went to the idle one


def test_no_engine_process_outlives_a_killed_server(two_engines):
    pids = [e["pid"] for e in _engines(two_engines)]
    assert len(set(pids)) == 2
    two_engines.proc.kill()
    two_engines.proc.wait(WAIT_S)
    assert all(gone(pid) for pid in pids), "an engine process outlived its server"


def _engines(server: Server) -> list[dict]:
    with urllib.request.urlopen(server.base + "/engines", timeout=10) as reply:
        return json.loads(reply.read())["engines"]


def test_a_dead_tensor_parallel_rank_ends_every_stream_and_the_server(model_dir, tmp_path):
    server = Server(model_dir, "--tp", "2", log=tmp_path / "server.log", paced=True)
    try:
        engine = _engines(server)[0]
        assert len(engine["tp_workers"]) == 1
        stream = Stream(server.base, 500)
        assert stream.first.wait(WAIT_S)
        os.kill(engine["tp_workers"][0], signal.SIGKILL)
        stream.thread.join(WAIT_S)
        assert not stream.thread.is_alive(), "the stream hung after a rank died"
        assert stream.lines[-1] == "[DONE]" and "error" in stream.events()[-1]
        assert server.proc.wait(WAIT_S) == 1
        log = server.log()
        assert "minisgl: the engine process" in log and "rank 1" in log and "Traceback" not in log
        assert gone(engine["pid"])
    finally:
        server.stop()
