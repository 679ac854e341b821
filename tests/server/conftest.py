"""The servers the tests here talk to, each started once for the session (a start costs the suite a model load):
the plain one that test_serve.py's API tests and test_hostile.py's hostile clients share, and the one behind an
API key that also lets one web origin call it and logs each request, which test_api_key.py, test_cors.py and
test_server_logs.py share."""

from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.serve import Server, free_port, with_chat_template

MODEL = "llama"
READ_TIMEOUT_S = 2.0  # short, so that a client too slow to send its request is answered within a test
MAX_CONNECTIONS = 100  # above test_serve's 64 concurrent clients
API_KEY = "sk-minisgl-test-0123"  # the keyed server's
# the keyed server's sampling defaults, overridden: greedy and 5 tokens for requests that leave them out (a
# request that gives them is not touched)
OVERRIDE = '{"temperature": 0, "max_new_tokens": 5}'
STATS_EVERY_S = 0.25  # the keyed server's --log-stats


@pytest.fixture(scope="session")
def api_model_dir(model_dirs, tmp_path_factory):
    return with_chat_template(model_dirs["llama"], tmp_path_factory.mktemp("serve") / MODEL)


@pytest.fixture(scope="session")
def api_server(api_model_dir, tmp_path_factory):
    srv = Server(api_model_dir, "--cache", "naive", "--max-running", "16", "--page-size", "2",
                 "--read-timeout", str(READ_TIMEOUT_S), "--max-connections", str(MAX_CONNECTIONS),
                 log=tmp_path_factory.mktemp("serve-log") / "server.log")
    yield srv
    srv.stop()


class QuietFiles(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="session")
def page_site(tmp_path_factory):
    """A static web server for client pages, on an origin of its own (another port than any API's): its folder
    (a test writes its page there) and its port."""
    root = tmp_path_factory.mktemp("pages")
    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), functools.partial(QuietFiles, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield Path(root), httpd.server_address[1]
    httpd.shutdown()


@pytest.fixture(scope="session")
def api_key() -> str:
    """The keyed server's key."""
    return API_KEY


@pytest.fixture(scope="session")
def keyed_server(model_dirs, page_site, tmp_path_factory):
    """``--api-key`` with ``--allow-origin`` for the page site's origin, overridden sampling defaults,
    ``--log-requests`` and a stats line every STATS_EVERY_S. Paced: a request is still running when
    test_server_logs.py's client that leaves mid-stream goes."""
    srv = Server(model_dirs["llama"], "--api-key", API_KEY, "--allow-origin", f"http://127.0.0.1:{page_site[1]}",
                 "--max-running", "4", "--override-generation-config", OVERRIDE, "--log-requests",
                 "--log-stats", str(STATS_EVERY_S), log=tmp_path_factory.mktemp("serve-key") / "server.log",
                 paced=True)
    yield srv
    srv.stop()
