"""A child process that outlives its parent leaves: the engine process and the tensor-parallel ranks use it."""

from __future__ import annotations

import os
import threading
import time


def exit_with_parent(parent_pid: int, poll_s: float = 0.5) -> None:
    """If the parent disappears without stopping this process (SIGKILL), exit 1 instead of lingering; the
    processes under this one notice the same way."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="minisgl-parent-watch", daemon=True).start()
