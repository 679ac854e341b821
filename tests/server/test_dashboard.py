"""``minisgl serve --dashboard`` in headless Chromium: a real server on a tiny random model, the official openai
client, and the page read as a person would see it.

Requests show up on the page as they run; what the page says of a step (who waits and why, the KV pool) is what
``--trace-out`` wrote for that step; the page loads nothing but itself and its stream and logs no error; text
stays hidden without ``--dashboard-show-text``. A viewer that stops reading does not slow the engine, and the
server holds a bounded amount for it.
"""

from __future__ import annotations

import socket
import threading
import time

import openai
import pytest

from render.trace_format import read_trace
from tests.support.browser import requested_urls
from tests.support.serve import Server

MODEL = "llama"
SECRET = "zebra"  # a word in every prompt: it must not reach the page unless text is shown
WAIT_S = 60.0


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", timeout=WAIT_S, max_retries=0)


def send_all(server: Server, n: int, max_tokens: int, sent: dict[int, float] | None = None) -> list[int]:
    """n completions at once, each on its own thread; returns their generated token counts."""
    api = client(server)
    counts = [0] * n

    def one(i: int) -> None:
        if sent is not None:
            sent[i] = time.monotonic()
        reply = api.completions.create(model=MODEL, prompt=f"{SECRET} {i} " * 4, max_tokens=max_tokens,
                                       temperature=0, extra_body={"ignore_eos": True})
        counts[i] = reply.usage.completion_tokens

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    return counts


def page_uids(browser) -> set[int]:
    return set(browser.execute_script("""return Array.prototype.map.call(
        document.querySelectorAll('#gantt-bars svg'), function (r) { return Number(r.getAttribute('data-uid')); });"""))


def shown_step(browser) -> dict:
    """What the page says of the step it shows: its number, the queue (uid, kind, words) and the KV parts."""
    return browser.execute_script("""
      var kv = document.getElementById('kv'), q = document.querySelectorAll('#queue li');
      return {step: Number(document.getElementById('step-label').getAttribute('data-step')),
              waits: Array.prototype.map.call(q, function (li) {
                return [Number(li.getAttribute('data-uid')), li.getAttribute('data-kind'),
                        li.querySelector('.reason').textContent]; }),
              kv: ['requests', 'cached', 'free', 'total'].map(function (k) { return Number(kv.getAttribute('data-' + k)); })};
    """)


@pytest.fixture(scope="module")
def text_server(model_dirs, tmp_path_factory):
    """A dashboard that shows the text, for the two tests at the end of this file (a start costs a model load):
    the one of a viewer that stops reading, and the one of the text, which stops it with the page still open."""
    server = Server(model_dirs[MODEL], "--dashboard", "--dashboard-show-text", "--max-running", "16",
                    log=tmp_path_factory.mktemp("dashboard-text") / "server.log")
    yield server
    server.stop()


def test_the_page_follows_the_engine_and_agrees_with_the_trace_file(model_dirs, browser, tmp_path):
    trace_path = tmp_path / "trace.jsonl"
    server = Server(model_dirs[MODEL], "--dashboard", "--trace-out", str(trace_path), "--max-running", "2",
                    "--page-size", "2", log=tmp_path / "server.log", paced=True)
    try:
        browser.get(server.base + "/dashboard")
        sent: dict[int, float] = {}
        # long enough that a viewer which skips to the newest step (a slow browser) still holds many of them
        worker = threading.Thread(target=send_all, args=(server, 8, 120, sent))
        worker.start()
        appeared: dict[int, float] = {}
        while worker.is_alive() or len(appeared) < 8:
            now = time.monotonic()
            for uid in page_uids(browser):
                appeared.setdefault(uid, now)
            if now - min(sent.values(), default=now) > WAIT_S:
                break
            time.sleep(0.05)
        worker.join()
        assert sorted(appeared) == list(range(8))
        # each request was on the page within a second of being sent (it arrives before the engine's next step)
        assert max(appeared[uid] - sent[uid] for uid in appeared) < 1.0
        trace = read_trace(trace_path)
        by_step = {e.step: e for e in trace.events}
        last = trace.events[-1].step
        deadline = time.monotonic() + 5
        while shown_step(browser)["step"] != last and time.monotonic() < deadline:
            time.sleep(0.05)
        compared, waits_seen = 0, 0
        for _ in range(400):  # step back through the steps the page holds, until some with waits are compared
            if compared >= 10 and waits_seen > 0:
                break
            shown = shown_step(browser)
            event = by_step[shown["step"]]
            want_waits = [[w.uid, w.kind, w.text] for w in event.waits]
            assert [w for w in shown["waits"] if w[1]] == want_waits, shown["step"]
            kv = event.kv
            assert shown["kv"] == [sum(p for _, p in kv.by_request), kv.cached, kv.free, kv.total], shown["step"]
            compared += 1
            waits_seen += len(want_waits)
            before = shown["step"]
            browser.find_element("id", "prev").click()
            if shown_step(browser)["step"] == before:
                break
        assert compared >= 10 and waits_seen > 0  # --max-running 2: the others waited for a row
        assert "paused" in browser.find_element("id", "step-label").text
        browser.find_element("css selector", "#batch .uid").click()  # follow a request
        assert "arrived" in browser.find_element("id", "request").text
        browser.find_element("id", "radix-toggle").click()
        assert browser.find_element("id", "radix-panel").is_displayed()
        # read-only and private: no text, nothing fetched but the page and its stream, no console error
        assert SECRET not in browser.page_source
        figures = browser.find_element("id", "figures").text
        assert "tokens/s" in figures and "TTFT p50 ms" in figures
        urls = {u.split("?")[0] for u in requested_urls(browser)}
        assert urls <= {server.base + "/dashboard", server.base + "/dashboard/events"}
        assert browser.get_log("browser") == []
    finally:
        server.stop()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def unsent_bytes(server_port: int, client_port: int) -> int:
    """The server side's send queue on the connection to ``client_port`` (/proc/net/tcp, hex fields)."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)
            if local == server_port and remote == client_port:
                return int(fields[4].split(":")[0], 16)
    return 0


def test_a_viewer_that_stops_reading_does_not_slow_the_engine(text_server):
    server = text_server
    stalled = None
    try:
        def tokens_per_s() -> tuple[float, list[int]]:
            start = time.monotonic()
            counts = send_all(server, 16, 48)
            return sum(counts) / (time.monotonic() - start), counts

        send_all(server, 4, 8)  # warm up
        free_rate, _ = tokens_per_s()
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", server.port))
        stalled.sendall(f"GET /dashboard/events HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
        for _ in range(3):  # fill its socket: the server's stream for it is now stuck in its send
            send_all(server, 16, 48)
        client_port = stalled.getsockname()[1]
        assert unsent_bytes(server.port, client_port) > 0  # it really is not reading
        before = rss_kib(server.proc.pid)
        stalled_runs = [tokens_per_s() for _ in range(3)]  # the best of three: one run on two shared cores is noisy
        for _ in range(3):
            send_all(server, 16, 48)
        after = rss_kib(server.proc.pid)
        assert all(counts == [48] * 16 for _, counts in stalled_runs)  # every request finished
        stalled_rate = max(rate for rate, _ in stalled_runs)
        assert stalled_rate >= 0.5 * free_rate, (stalled_rate, free_rate)
        assert after - before < 64 * 1024, (before, after)  # what it holds for the viewer does not grow with steps
    finally:
        if stalled is not None:
            stalled.close()


def test_prompts_and_completions_show_only_with_show_text(text_server, browser):
    """Last of the text server's tests: it stops the server."""
    browser.get("about:blank")
    browser.get_log("browser")  # a previous test's page, whose server is gone
    server = text_server
    browser.get(server.base + "/dashboard")
    send_all(server, 2, 8)
    deadline = time.monotonic() + 10
    while SECRET not in browser.find_element("id", "gantt-labels").text and time.monotonic() < deadline:
        time.sleep(0.1)
    assert SECRET in browser.find_element("id", "gantt-labels").text
    assert browser.get_log("browser") == []
    # the page is still open, its stream endless: SIGTERM must still stop the server at once, and cleanly
    asked = time.monotonic()
    server.stop()
    assert server.proc.returncode == 0 and time.monotonic() - asked < 10, server.proc.returncode
