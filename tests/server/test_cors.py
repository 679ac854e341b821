"""``serve --allow-origin``: a web page from another origin calls the API from headless Chromium.

The page's origin is allowed, so its fetch gets through the browser's preflight (which carries no key) to an
answer equal to LLM.generate, and can read the request id and a 401's error; the same page from an origin the
server was not given cannot read anything; an origin no browser would send is a usage error before the load.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core import LLM, SamplingParams
from tests.support.serve import WAIT_S, Server

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama"  # the served name: the test checkpoint's directory
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
def page_port(page_site):
    """The page on the static site of tests/server/conftest.py, whose origin the keyed server allows."""
    root, port = page_site
    (root / "client.html").write_text(PAGE)
    return port


@pytest.fixture(scope="module")
def server(keyed_server):  # tests/server/conftest.py's, shared with test_api_key.py
    return keyed_server


def call_from_page(browser, page: str, server: Server, key: str) -> dict:
    browser.get(page)
    return browser.execute_async_script(
        "const done = arguments[arguments.length - 1]; window.complete(arguments[0], arguments[1]).then(done);",
        server.base, key)


def test_a_page_from_an_allowed_origin_reads_the_answer_its_id_and_a_401(browser, server, api_key, page_port,
                                                                         model_dirs):
    browser.set_script_timeout(WAIT_S)
    page = f"http://127.0.0.1:{page_port}/client.html"
    got = call_from_page(browser, page, server, api_key)
    want = LLM(str(model_dirs["llama"])).generate(["hello there"], SamplingParams(max_tokens=6, ignore_eos=True))[0]
    assert got["status"] == 200, got
    assert got["body"]["choices"][0]["text"] == want["text"]
    assert got["id"].startswith("req-")  # exposed to the page's script

    refused = call_from_page(browser, page, server, "sk-wrong")
    assert refused["status"] == 401 and refused["body"]["error"]["code"] == "invalid_api_key"


def test_the_same_page_from_an_origin_not_given_cannot_read_the_api(browser, server, api_key, page_port):
    browser.set_script_timeout(WAIT_S)
    got = call_from_page(browser, f"http://localhost:{page_port}/client.html", server, api_key)  # another origin
    assert "failed" in got and "status" not in got, got


@pytest.mark.parametrize("origin", ["http://127.0.0.1:3000/", "localhost:3000", "http://a.example/app"])
def test_an_origin_no_browser_sends_is_a_usage_error_before_the_model_loads(model_dirs, origin):
    done = subprocess.run([sys.executable, "-m", "minisgl_cli", "serve", "--model", str(model_dirs["llama"]),
                           "--port", "0", "--allow-origin", origin], cwd=ROOT, capture_output=True, text=True,
                          timeout=WAIT_S)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'--allow-origin'" in lines[0] and "scheme://host[:port]" in lines[0], done.stderr
