"""Process-group plumbing for tensor parallelism: join, broadcast a command, leave, abort.

The default group (NCCL on CUDA, gloo on the CPU) carries the layers' collectives, with a timeout so a rank that
hangs cannot hold the others forever. A gloo control group carries rank 0's commands; idle workers wait on it
with no practical deadline, since the caller may pause as long as it likes between two ``generate`` calls.
"""

from __future__ import annotations

import socket
import threading
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

CONTROL_TIMEOUT = timedelta(days=30)  # idle workers wait for the next command this long
TEARDOWN_WAIT_S = 10.0  # how long leaving the process groups may take before a rank goes without it

T = TypeVar("T")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_groups(rank: int, size: int, port: int, backend: str, timeout_s: float) -> dist.ProcessGroup:
    """Join the default group (the layers' collectives) and return the gloo control group."""
    kwargs = {"device_id": torch.device("cuda", rank)} if backend == "nccl" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=timeout_s), **kwargs)
    return dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)


def broadcast_object(obj: T, control: dist.ProcessGroup) -> T:
    """Rank 0's ``obj`` on every rank (the others pass a placeholder)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=control)
    return box[0]


def leave_groups() -> None:
    """destroy_process_group, bounded in time: NCCL's teardown can wait on peers that have gone; past the wait
    this rank goes on without it, since a closed group is never used again."""
    if not dist.is_initialized():
        return

    def destroy() -> None:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the groups may be broken after a failure; nothing left to free
            pass

    thread = threading.Thread(target=destroy, name="minisgl-tp-teardown", daemon=True)
    thread.start()
    thread.join(TEARDOWN_WAIT_S)


def abort_nccl() -> None:
    """Unlike gloo, NCCL does not notice a vanished peer: abort the communicators so rank 0's pending
    collective fails now instead of at the timeout (an experimental torch API, hence best effort)."""
    try:
        from torch.distributed.distributed_c10d import _abort_process_group

        _abort_process_group()
    except Exception:  # noqa: BLE001 - without it, the collective timeout still ends the wait
        pass
