"""``minisgl serve --api-workers N``: the HTTP side in several processes over one engine.

Concurrent openai clients get LLM.generate's greedy text from either process (the engine routes each reply to the
process that took its request: the uids in the request log say both took some), /metrics counts every request
whichever process answers the scrape, a process that dies is said and the other serves on, SIGTERM drains every
process before the engine stops, a dead engine ends them all, and the options it cannot serve with are refused
before the load. The counts' exchange and the
stream's line rule are checked directly too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from core import LLM, SamplingParams
from serving.api.metrics import Metrics
from serving.api.responses import sse_line
from serving.api.share import PUBLISH_S, SharedCounts
from tests.server.test_engine_process import Stream, engine_pid, gone
from tests.support.serve import WAIT_S, Server

MODEL = "llama"
PROMPTS = [f"request {i}: the quick brown fox" for i in range(24)]


@pytest.fixture(scope="module")
def model_dir(model_dirs):
    return model_dirs["llama"]


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), cache="naive", max_running_req=8, page_size=2)


def spawned(pid: int) -> list[int]:
    """The processes ``pid`` started with multiprocessing's spawn (not its resource tracker)."""
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat, open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if int(stat.read().split(")")[-1].split()[1]) == pid and b"spawn_main" in cmdline.read():
                    out.append(int(entry))
        except (OSError, ValueError):  # gone meanwhile
            pass
    return out


def test_two_api_processes_answer_like_generate_and_count_every_request(model_dir, llm, tmp_path):
    server = Server(model_dir, "--api-workers", "2", "--cache", "naive", "--max-running", "8", "--page-size", "2",
                    "--log-requests", log=tmp_path / "server.log")
    try:
        pooled = openai.OpenAI(base_url=server.base + "/v1", api_key="none", timeout=WAIT_S, max_retries=0)

        def streamed(prompt: str, client: openai.OpenAI = pooled) -> str:
            chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
            return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)

        with ThreadPoolExecutor(12) as pool:
            texts = list(pool.map(streamed, PROMPTS))
        want = llm.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))
        assert texts == [w["text"] for w in want]
        uids = [int(uid) for uid in re.findall(r" uid=(\d+) ", server.log())]
        assert len(uids) == len(PROMPTS) and {uid % 2 for uid in uids} == {0, 1}, "one process took every request"
        metrics = server.wait_metrics(lambda m: m['requests_finished_total{finish_reason="length"}'] == len(PROMPTS))
        assert metrics['requests_finished_total{finish_reason="length"}'] == len(PROMPTS)
        assert metrics["generation_tokens_total"] == 12 * len(PROMPTS)
        assert metrics["time_to_first_token_seconds_count"] == len(PROMPTS)
        assert metrics["requests_in_flight"] == 0

        # one process killed: it is said, and the other serves on (new connections go to the socket still open)
        time.sleep(3 * PUBLISH_S)  # its counts written since its last request (they are what is left of it)
        engine = engine_pid(server)
        (worker,) = [child for child in spawned(server.proc.pid) if child != engine]
        os.kill(worker, signal.SIGKILL)
        assert gone(worker)
        fresh = openai.OpenAI(base_url=server.base + "/v1", api_key="none", timeout=WAIT_S, max_retries=0)
        for prompt in PROMPTS[:4]:  # a client of its own: the pool's kept-alive connections to the dead one are gone
            assert streamed(prompt, fresh) == want[PROMPTS.index(prompt)]["text"]
        assert server.terminate() == 0
        log = server.log()
        assert "in 2 API processes" in log and "Traceback" not in log
        assert f"API process 1 (pid {worker}) exited with code -9; 1 serve on" in log
        assert f"minisgl stopped: {len(PROMPTS) + 4} requests answered" in log.splitlines()
    finally:
        server.stop()


def test_sigterm_drains_every_api_process_before_the_engine_stops(model_dir, tmp_path):
    server = Server(model_dir, "--api-workers", "2", "--max-running", "8", "--shutdown-timeout", "120",
                    log=tmp_path / "server.log", paced=True)
    try:
        streams = [Stream(server.base, 500) for _ in range(6)]  # long enough to be running at the signal
        assert all(stream.first.wait(WAIT_S) for stream in streams)
        assert server.wait_metrics(lambda m: m["requests_in_flight"] == 6)["requests_in_flight"] == 6
        time.sleep(3 * PUBLISH_S)  # each process's count in its file (a scrape adds the others' as last written)
        assert server.terminate(WAIT_S * 2) == 0
        for stream in streams:
            stream.thread.join(WAIT_S)
            assert stream.lines[-1] == "[DONE]"
            assert stream.events()[-1]["choices"][0]["finish_reason"] == "length"  # ran to its end, not aborted
        log = server.log()
        assert "finishing 6 responses" in log and "minisgl stopped: 6 requests answered" in log
        assert log.count("shutting down") == 1 and "Traceback" not in log  # the first process speaks for all
    finally:
        server.stop()


def test_a_dead_engine_ends_every_api_process(model_dir, tmp_path):
    server = Server(model_dir, "--api-workers", "2", "--max-running", "4", log=tmp_path / "server.log", paced=True)
    try:
        pid = engine_pid(server)
        others = [child for child in spawned(server.proc.pid) if child != pid]
        assert len(others) == 1  # the second API process (the engine is the other child)
        streams = [Stream(server.base, 500) for _ in range(4)]
        assert all(stream.first.wait(WAIT_S) for stream in streams)
        os.kill(pid, signal.SIGKILL)
        for stream in streams:
            stream.thread.join(WAIT_S)
            assert stream.lines[-1] == "[DONE]" and "engine" in stream.events()[-1]["error"]["message"]
        assert server.proc.wait(WAIT_S) == 1
        assert gone(others[0]), "an API process outlived the server"
        assert "Traceback" not in server.log()
    finally:
        server.stop()


@pytest.mark.parametrize("extra, fragment", [(["--dashboard"], "--dashboard needs one API process"),
                                             (["--dp", "2"], "--api-workers with --dp is not supported")])
def test_options_that_need_one_api_process_are_refused_before_the_load(model_dir, extra, fragment):
    done = subprocess.run([sys.executable, "-m", "minisgl_cli", "serve", "--model", str(model_dir),
                           "--api-workers", "2", *extra], capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], done.stderr


def test_each_process_reports_its_own_counts_plus_the_others_newest(tmp_path):
    first, second = Metrics(), Metrics()
    first.prompt_tokens, first.generated_tokens, first.requests = 10, 4, {"length": 1}
    first.ttft.observe(0.02)
    second.prompt_tokens, second.generated_tokens, second.requests = 5, 7, {"length": 2, "stop": 1}
    second.ttft.observe(0.3)
    second.rejected_with(503)
    shares = [SharedCounts(tmp_path, i, 2) for i in range(2)]
    for share, metrics, waiting in zip(shares, (first, second), (3, 1)):
        share.start(lambda m=metrics, w=waiting: {"metrics": m.snapshot(), "waiting": w, "in_flight": w + 1})
    shares[0].read()
    total = first.plus([other["metrics"] for other in shares[0].others])
    assert (total.prompt_tokens, total.generated_tokens) == (15, 11)
    assert total.requests == {"length": 3, "stop": 1} and total.rejected == {503: 1}
    assert total.ttft.count == 2 and total.ttft.total == pytest.approx(0.32)
    assert shares[0].waiting_elsewhere() == 1 and shares[1].waiting_elsewhere() == 3
    assert shares[1].in_flight_elsewhere() == 4
    second.generated_tokens = 9  # the second process goes on; its last count is written as it stops
    for share in shares:
        share.stop()
    shares[0].read()
    assert shares[0].others[0]["metrics"]["generated_tokens"] == 9
    shares[0].stop(remove=True)
    assert not tmp_path.exists() and shares[0].others[0]["metrics"]["generated_tokens"] == 9  # kept


def test_an_event_is_one_line_for_readers_that_end_lines_at_unicode_breaks():
    event = {"choices": [{"text": "a\u2028b\u2029c\x85d\ne\u00e9"}]}
    line = sse_line(event).decode()
    assert line.endswith("\n\n") and len(line.strip().splitlines()) == 1
    assert json.loads(line.removeprefix("data: ")) == event



def test_two_api_processes_by_default_on_a_gpu_one_on_a_cpu(monkeypatch):
    import torch

    from minisgl_cli.serve.command import api_workers_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert api_workers_for(None, None, dp=1, dashboard=False) == 2
    assert api_workers_for(None, None, dp=2, dashboard=False) == 1  # --dp: one front for every engine
    assert api_workers_for(None, None, dp=1, dashboard=True) == 1  # the dashboard shows one process's requests
    assert api_workers_for(None, "cpu", dp=1, dashboard=False) == 1
    assert api_workers_for(3, "cpu", dp=1, dashboard=False) == 3  # asked for: as asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert api_workers_for(None, None, dp=1, dashboard=False) == 1
    assert api_workers_for(None, "cuda", dp=1, dashboard=False) == 2

