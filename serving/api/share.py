"""One server in several API processes (``serve --api-workers N``): what each counts, for every one of them to
report.

A request's metrics are counted by the process that took it. So each process writes its counts (its Metrics'
snapshot, its requests waiting and in flight) to a file of its own in a directory they share, every ``PUBLISH_S``
and once more as it leaves, and reads the others' files at the same moment (and afresh for /metrics and the
stats line). What one of them reports (/metrics, the stats line, ``--max-queue``) is its own counts, live, plus
the others' as they were at most ``PUBLISH_S`` ago. A file is replaced whole (written beside it, then renamed),
so a reader never sees half of one; and no lock is shared between processes, so a stream never waits on another
process.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Callable

PUBLISH_S = 0.1


class SharedCounts:
    def __init__(self, directory: Path, me: int, processes: int) -> None:
        self.directory = directory
        self.me = me
        self.processes = processes
        self.others: list[dict[str, Any]] = []  # the other processes' newest counts, as last read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._counts: Callable[[], dict[str, Any]] | None = None
        self._removed = False

    def start(self, counts: Callable[[], dict[str, Any]]) -> None:
        """Publish ``counts()`` and read the others' every PUBLISH_S, on a thread of its own."""
        self._counts = counts
        self.exchange()
        self._thread = threading.Thread(target=self._run, name="minisgl-share", daemon=True)
        self._thread.start()

    def stop(self, remove: bool = False) -> None:
        """This process's last counts written (its requests are all answered by now) and the others' last read;
        ``remove``: the directory too (the first process, once the others have left), the counts kept."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.exchange()
        if remove:
            self._removed = True
            shutil.rmtree(self.directory, ignore_errors=True)

    def exchange(self) -> None:
        if self._counts is not None:
            self._write(self._counts())
        self.read()

    def read(self) -> None:
        """The others' newest counts (a scrape reads them afresh; a request's queue check takes the last read)."""
        if self._removed:
            return
        self.others = [counts for i in range(self.processes) if i != self.me
                       and (counts := self._read(i)) is not None]

    def waiting_elsewhere(self) -> int:
        return sum(other["waiting"] for other in self.others)

    def in_flight_elsewhere(self) -> int:
        return sum(other["in_flight"] for other in self.others)

    def _run(self) -> None:
        while not self._stop.wait(PUBLISH_S):
            self.exchange()

    def _path(self, process: int) -> Path:
        return self.directory / f"counts{process}.json"

    def _write(self, counts: dict[str, Any]) -> None:
        path = self._path(self.me)
        part = path.with_suffix(".part")
        part.write_text(json.dumps(counts))
        os.replace(part, path)

    def _read(self, process: int) -> dict[str, Any] | None:
        try:
            return json.loads(self._path(process).read_text())
        except (FileNotFoundError, ValueError):  # not written yet
            return None
