"""A tensor-parallel worker process (ranks 1..N-1): build this rank's slice of the model, then follow rank 0
(core/llm/tp_group.py). It ignores Ctrl-C (rank 0 shuts it down) and exits by itself if its parent disappears."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from core.config import EngineConfig
from core.distributed.groups import broadcast_object, init_groups, leave_groups
from core.distributed.info import TPInfo, tp_scope
from core.errors import MinisglError
from core.llm.heap import freeze_startup_heap
from core.llm.orphan import exit_with_parent
from core.scheduler.inbox import Message
from core.scheduler.scheduler import Scheduler


@dataclass(frozen=True)
class Command:
    """What rank 0 sends the workers before every step: the messages its loop took in (requests with their
    seeds decided, aborts, prefix-cache resets: every rank applies them at the same point, so all keep forming
    the same batches), or stop."""

    messages: tuple[Message, ...] = ()
    eos_token_ids: frozenset[int] = frozenset()
    stop: bool = False


class Follower(Scheduler):
    """A scheduler fed before every step with the messages rank 0's loop took in, whose replies go nowhere (rank
    0 reports the results). It runs one endless loop, waiting in the broadcast when it has nothing to do."""

    def __init__(self, config: EngineConfig, model_dir: Path, control: dist.ProcessGroup) -> None:
        super().__init__(config, model_dir, exchange=self._follow_rank0)
        self._control = control

    def _follow_rank0(self, messages: list[Message]) -> list[Message] | None:
        command = broadcast_object(Command(), self._control)
        if command.stop:
            return None
        self.eos_token_ids = command.eos_token_ids
        return list(command.messages)

    def wait_for_work(self, stop_when_idle: bool) -> bool:
        return True  # the next broadcast is the wait


def worker_main(rank: int, size: int, port: int, backend: str, config: EngineConfig, model_dir: Path,
                timeout_s: float, parent_pid: int, errors: mp.SimpleQueue) -> None:
    """Build this rank's slice of the model, then run the scheduler on each command until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; rank 0 decides
    exit_with_parent(parent_pid, poll_s=1.0)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:  # the ranks share the CPU: don't oversubscribe it
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    try:
        control = init_groups(rank, size, port, backend, timeout_s)
        with tp_scope(TPInfo(rank, size)):
            scheduler = Follower(config, model_dir, control)
        freeze_startup_heap()
        dist.all_gather_object([None] * size, "ready", group=control)
        scheduler.run_until_stopped()  # until rank 0 says stop
        scheduler.engine.release_cuda_graphs()  # graphs hold NCCL work: free them before the communicators
        leave_groups()
    except BaseException as exc:  # noqa: BLE001 - report, then leave: rank 0 turns this into WorkerError
        errors.put((rank, f"{type(exc).__name__}: {exc}"))
        if not isinstance(exc, (RuntimeError, MinisglError)) or not str(exc):
            traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing left to tear down: skip the slow interpreter shutdown
