"""``minisgl serve`` as a child process that a command starts, waits for and always stops.

The child runs in a session of its own, so a Ctrl-C typed at the terminal reaches only the parent, which then
stops it with SIGTERM (the server's graceful shutdown), and kills its whole process group if that takes too
long. On Linux the child also gets SIGTERM if the parent dies without a word (killed), so no server is left
holding the model and the port. Its output goes to a temporary log, quoted when it fails to start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import httpx

from core.errors import MinisglError

STOP_SECONDS = 20.0  # SIGTERM, then this long before the process group is killed
READY_SECONDS = 1800.0  # a first GGUF conversion or a large model on a GPU can take minutes to load


class ServerStartError(MinisglError):
    """The server exited or stayed silent before answering /health."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_arguments(model: str | None, settings: dict[str, Any], port: int,
                    flag: Callable[[str], str]) -> list[str]:
    """``minisgl serve``'s command line for engine options given by EngineConfig's names."""
    args = ["--host", "127.0.0.1", "--port", str(port), "--shutdown-timeout", "5"]
    if model is not None:
        args += ["--model", model]
    for name, value in settings.items():
        if isinstance(value, bool):
            args.append(flag(name) if value else f"--no-{flag(name)[2:]}")
        elif value is not None:
            args += [flag(name), str(value)]
    return args


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerProcess:
    """``with ServerProcess(args) as server:`` starts ``minisgl serve ARGS``; ``server.wait_ready()`` returns
    once /health answers; leaving the block stops it, whatever ended the block."""

    def __init__(self, args: list[str], port: int, env: dict[str, str] | None = None) -> None:
        self.command = [sys.executable, "-m", "minisgl_cli", "serve", *args]
        self.url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.log = tempfile.TemporaryFile()

    def __enter__(self) -> "ServerProcess":
        linux = sys.platform.startswith("linux")
        self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                        env=self.env, start_new_session=True,
                                        preexec_fn=_die_with_parent if linux else None)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout: float = READY_SECONDS) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise ServerStartError(f"the server exited with code {code} before it was ready: {self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise ServerStartError(f"the server did not answer /health within {timeout:.0f} s: {self.tail()}")

    def stop(self) -> None:
        """SIGTERM and a wait; the process group killed if it does not end in STOP_SECONDS."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.log.close()

    def tail(self, lines: int = 3) -> str:
        """The last lines of the server's output, on one line."""
        self.log.seek(0)
        text = self.log.read().decode(errors="replace").strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:]) or "(no output)"
