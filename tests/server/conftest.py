"""The server most tests here talk to, started once for the session: test_serve.py's API tests and
test_hostile.py's hostile clients share it (a start costs the suite a model load)."""

from __future__ import annotations

import pytest

from tests.support.serve import Server, with_chat_template

MODEL = "llama"
READ_TIMEOUT_S = 2.0  # short, so that a client too slow to send its request is answered within a test
MAX_CONNECTIONS = 100  # above test_serve's 64 concurrent clients


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
