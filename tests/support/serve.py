"""A real ``minisgl serve`` process on 127.0.0.1 for the server tests, and reading its metrics."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

PACED = "MINISGL_DISABLE_CPU_DECODE"  # see Server
START_TIMEOUT_S = 120.0
WAIT_S = 60.0  # the most a test waits for one answer
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def with_chat_template(model_dir: str, dest: Path) -> Path:
    """A copy of a test checkpoint whose tokenizer has a (tiny) chat template."""
    if not dest.exists():
        shutil.copytree(model_dir, dest)
        config_path = dest / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["chat_template"] = CHAT_TEMPLATE
        config_path.write_text(json.dumps(config))
    return dest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def without_columns(env: os._Environ) -> dict[str, str]:
    """The environment as a service manager gives it: no terminal width, so a line that wraps shows."""
    return {name: value for name, value in env.items() if name != "COLUMNS"}


class Server:
    def __init__(self, model: Path, *args: str, log: Path, paced: bool = False, ca: Path | None = None) -> None:
        """``paced``: single-request decode steps on torch rather than the C step, which runs a test model's
        request to its end before a test can watch it run (MINISGL_DISABLE_CPU_DECODE). ``ca``: the server
        speaks HTTPS (its args give the certificate), trusted through this CA file."""
        self.port = free_port()
        self.base = f"{'https' if ca else 'http'}://127.0.0.1:{self.port}"
        self.tls = ssl.create_default_context(cafile=ca) if ca else None
        self.log_path = log
        self._log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "minisgl_cli", "serve", "--model", str(model),
                                      "--port", str(self.port), *args],
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**without_columns(os.environ), **({PACED: "1"} if paced else {})})
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2, context=self.tls) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not start in {START_TIMEOUT_S} s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """The scrape as {'name{labels}': value}."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=10, context=self.tls) as reply:
            text = reply.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name.removeprefix("minisgl_")] = float(value)
        return out

    def wait_metrics(self, condition, timeout_s: float = 30.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout_s
        while True:
            metrics = self.metrics()
            if condition(metrics) or time.monotonic() > deadline:
                return metrics
            time.sleep(0.1)

    def terminate(self, timeout_s: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def request(server: Server, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict, Any]:
    """Any request as it is sent (no Content-Type unless given), and its JSON reply."""
    req = urllib.request.Request(server.base + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as reply:
            return reply.status, json.loads(reply.read()), reply.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers


def assert_openai_error(reply: dict, fragment: str) -> None:
    assert set(reply) == {"error"}, reply
    assert set(reply["error"]) == {"message", "type", "param", "code"}, reply
    assert fragment in reply["error"]["message"], reply
