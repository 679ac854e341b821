"""Tensors the kernels derive from a model's weights, kept on disk so that a later start reads them back.

Why: building a CPU engine re-derives the same tensors from the same weights on every start (the 4-bit codes of
the embedded GGUF's linears, the LM head's int8 copy and its sums of magnitudes), which took more time than
loading the weights. They depend only on the weights and on the code that derives them, so the engine keeps them
in one safetensors file under MINISGL_HOME (core/models/weights.py's ``derived_cache_path`` names it after the
weight files' sizes and modification times, and after ``SOURCE_KEY``: a hash of every kernel source here and of
torch's version), and a changed weights file or a changed kernel is never served stale.

The file is written to a temporary name and renamed into place, so an interrupted write leaves no half file;
one that cannot be read (corrupt, truncated, another format) is derived afresh and rewritten, never fatal.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch

Derived = tuple[torch.Tensor, ...] | None  # what one entry holds: some tensors, or None (nothing to derive)
ENTRIES_KEY = "minisgl.derived"  # the file's metadata: entry name -> its tensors' count, or null


CORE = Path(__file__).resolve().parents[1]
# what derives the entries: the kernels, the layers (a fused weight's layout) and the loader that fills them
SOURCES = ("kernels/**/*.py", "kernels/**/*.c", "kernels/**/*.h", "kernels/**/*.cu", "layers/*.py",
           "models/loader.py")


@lru_cache(maxsize=1)
def source_key() -> str:
    """A hash of the sources that derive the entries (``SOURCES``) and torch's version: any edit keys a new file."""
    digest = hashlib.sha256(torch.__version__.encode())
    for path in sorted(p for pattern in SOURCES for p in CORE.glob(pattern)):
        digest.update(str(path.relative_to(CORE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


class DerivedCache:
    """Named entries of tensors derived from the weights: read from ``path`` when it holds them, else derived and
    kept for ``save``. Without a path (random weights, or the cache turned off) it only derives."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._entries: dict[str, Derived] = self._read(path) if path is not None else {}
        self._new = False

    @staticmethod
    def _read(path: Path) -> dict[str, Derived]:
        if not path.is_file():
            return {}
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt", device="cpu") as f:
                counts = json.loads((f.metadata() or {})[ENTRIES_KEY])
                return {name: None if count is None else tuple(_aligned(f.get_tensor(f"{name}/{i}"))
                                                               for i in range(count))
                        for name, count in counts.items()}
        except Exception:  # unreadable in any way: derived again, and the file rewritten by save
            return {}

    def peek(self, name: str) -> Derived:
        """The entry ``name`` when it is held (read back or derived), else None; derives nothing."""
        return self._entries.get(name)

    def get(self, name: str, derive: Callable[[], Derived]) -> Derived:
        """The entry ``name``: read back, or derived now (and kept)."""
        if name not in self._entries:
            found = derive()
            self._entries[name] = None if found is None else tuple(t.contiguous() for t in found)
            self._new = True
        return self._entries[name]

    def save(self) -> None:
        """Write the entries if some were derived in this process: to a temporary file renamed into place, older
        files beside it (other kernel sources) removed. A failure to write leaves the start as it was."""
        if self.path is None or not self._new:
            return
        from safetensors.torch import save_file

        tensors = {f"{name}/{i}": _own(t) for name, found in self._entries.items() for i, t in enumerate(found or ())}
        counts = {name: None if found is None else len(found) for name, found in self._entries.items()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".writing-", suffix=".safetensors", dir=self.path.parent)
            os.close(fd)
            try:
                save_file(tensors, tmp, metadata={ENTRIES_KEY: json.dumps(counts)})
                os.replace(tmp, self.path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            for old in self.path.parent.glob("*.safetensors"):
                if old != self.path:
                    old.unlink(missing_ok=True)
        except OSError:
            return
        self._new = False


def _own(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor alone in its storage (safetensors writes no views of a larger tensor)."""
    return tensor if tensor.untyped_storage().nbytes() == tensor.nbytes else tensor.clone()


def _aligned(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor in memory of torch's own allocator: safetensors hands tensors 8 bytes off a cache line, and the C
    kernels stream their panels fastest from aligned rows."""
    return tensor.clone() if tensor.data_ptr() % 64 else tensor
