"""``serve --allow-origin``: a web page from another origin calls the API from headless Chromium.

The page's origin is allowed, so its fetch gets through the browser's preflight (which carries no key) to an
answer equal to LLM.generate, and can read the request id and a 401's error; the same page from an origin the
server was not given cannot read anything; an origin no browser would send is a usage error before the load.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from core import LLM, SamplingParams
from tests.support.serve import WAIT_S, Server, free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama"  # the served name: the test checkpoint's directory
KEY = "sk-cors-test"
PAGE = """<!doctype html><meta charset="utf-8"><title>a client page</title>
<script>
window.complete = async (base, key) => {
  try {
    const reply = await fetch(base + "/v1/completions", {
      method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer " + key},
      body: JSON.stringify({model: "llama", prompt: "hello there", max_tokens: 6, temperature: 0,
                            ignore_eos: true}),
    });
    return {status: reply.status, id: reply.headers.get("X-Request-Id"), body: await reply.json()};
  } catch (error) {
    return {failed: String(error)};
  }
};
</script>
"""


@pytest.fixture(scope="module")
def page_port(tmp_path_factory):
    """A static server for the page, on an origin of its own (another port than the API's)."""
    root = tmp_path_factory.mktemp("page")
    (root / "client.html").write_text(PAGE)
    handler = functools.partial(QuietFiles, directory=str(root))
    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()


class QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server(model_dirs, page_port, tmp_path_factory):
    srv = Server(model_dirs["llama"], "--api-key", KEY, "--allow-origin", f"http://127.0.0.1:{page_port}",
                 "--max-running", "4", log=tmp_path_factory.mktemp("serve-cors") / "server.log")
    yield srv
    srv.stop()


def call_from_page(browser, page: str, server: Server, key: str) -> dict:
    browser.get(page)
    return browser.execute_async_script(
        "const done = arguments[arguments.length - 1]; window.complete(arguments[0], arguments[1]).then(done);",
        server.base, key)


def test_a_page_from_an_allowed_origin_reads_the_answer_its_id_and_a_401(browser, server, page_port, model_dirs):
    browser.set_script_timeout(WAIT_S)
    page = f"http://127.0.0.1:{page_port}/client.html"
    got = call_from_page(browser, page, server, KEY)
    want = LLM(str(model_dirs["llama"])).generate(["hello there"], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    assert got["status"] == 200, got
    assert got["body"]["choices"][0]["text"] == want["text"]
    assert got["id"].startswith("req-")  # exposed to the page's script

    refused = call_from_page(browser, page, server, "sk-wrong")
    assert refused["status"] == 401 and refused["body"]["error"]["code"] == "invalid_api_key"


def test_the_same_page_from_an_origin_not_given_cannot_read_the_api(browser, server, page_port):
    browser.set_script_timeout(WAIT_S)
    got = call_from_page(browser, f"http://localhost:{page_port}/client.html", server, KEY)  # another origin
    assert "failed" in got and "status" not in got, got


@pytest.mark.parametrize("origin", ["http://127.0.0.1:3000/", "localhost:3000", "http://a.example/app"])
def test_an_origin_no_browser_sends_is_a_usage_error_before_the_model_loads(model_dirs, origin):
    done = subprocess.run([sys.executable, "-m", "minisgl_cli", "serve", "--model", str(model_dirs["llama"]),
                           "--port", "0", "--allow-origin", origin], cwd=ROOT, capture_output=True, text=True,
                          timeout=WAIT_S)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'--allow-origin'" in lines[0] and "scheme://host[:port]" in lines[0], done.stderr
