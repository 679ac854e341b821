"""Compile a C kernel with the system's C compiler at first use, and load it with ctypes.

Why at run time: a wheel of prebuilt kernels would need a build per platform, while every Linux machine that
can build this project's C is one ``cc`` call away from it (a few seconds, once). The shared object lands in
MINISGL_HOME's cache under a name keyed by the source, the headers it includes from its own folder, the flags and
the compiler's version, so an edit or another compiler builds afresh and a stale object is never loaded. The
build writes to a temporary name and renames it into place, so two processes building at once cannot load a
half-written file.

It links OpenMP's runtime by its usual soname (libgomp.so.1); torch ships one under the same soname and has it
loaded already, so the kernel shares torch's threads instead of starting a second pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.env import home_dir

COMPILERS = ("cc", "gcc", "clang")
BUILD_TIMEOUT_S = 120


@dataclass(frozen=True)
class BuildResult:
    """A loaded library, or the reason there is none (one line, for the engine's precision note)."""

    library: ctypes.CDLL | None
    reason: str = ""


def x86_unsupported_reason(what: str, needed: dict[str, str], flags: frozenset[str],
                           machine: str | None = None) -> str:
    """Why this CPU cannot run ``what`` ('' when it can): x86-64 code that needs the CPU flags ``needed`` (the
    kernel's flag name -> the instructions' name, as the message says them)."""
    machine = machine or platform.machine()
    if machine.lower() not in ("x86_64", "amd64"):
        return f"{what} is written for x86-64 (this CPU is {machine})"
    missing = [name for flag, name in needed.items() if flag not in flags]
    return f"this CPU lacks {' and '.join(missing)} for {what}" if missing else ""


def find_compiler() -> str | None:
    for name in COMPILERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def _compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout  # all of it: nvcc's first line names the driver, its last the release


# a C function's ctypes signature: its argument types and its result type (None: void)
Signature = tuple[list, Any]


def build_library(source: Path, flags: tuple[str, ...], cache_dir: Path | None = None,
                  signatures: dict[str, Signature] | None = None, compiler: str | None = None,
                  pic: tuple[str, ...] = ("-fPIC",)) -> BuildResult:
    """``source`` compiled with ``flags`` into a shared object in the cache (reused when it exists), loaded, with
    each function named in ``signatures`` given its argument and result types. ``compiler``: the system's C
    compiler unless given (nvcc for CUDA sources, with ``pic`` passed through to its host compiler)."""
    compiler = compiler or find_compiler()
    if compiler is None:
        return BuildResult(None, f"no C compiler found (looked for {', '.join(COMPILERS)})")
    own = source.read_bytes()
    text = own + b"".join(header.read_bytes() for header in local_headers(source, own.decode()))
    key = hashlib.sha256(text + "\0".join(flags).encode() + _compiler_version(compiler).encode()).hexdigest()[:16]
    cache_dir = cache_dir or home_dir() / "kernels"
    target = cache_dir / f"{source.stem}-{key}.so"
    if not target.exists():
        reason = _compile(compiler, source, (*flags, *pic), target)
        if reason:
            return BuildResult(None, reason)
    try:
        library = ctypes.CDLL(str(target))
    except OSError as error:
        return BuildResult(None, f"the compiled {target.name} did not load ({error})")
    for name, (argtypes, restype) in (signatures or {}).items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, restype
    return BuildResult(library)


def local_headers(source: Path, text: str) -> list[Path]:
    """The headers ``source`` (whose text is ``text``) includes by a quoted name from its own folder
    (``#include "exp8.h"``): their text is part of the build's key, so an edit to a header builds afresh too."""
    names = re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, flags=re.MULTILINE)
    return [source.parent / name for name in names]


def _compile(compiler: str, source: Path, flags: tuple[str, ...], target: Path) -> str:
    """Build into ``target``; returns an empty string, or why it failed (the compiler's first error line)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
    except OSError as error:
        return f"cannot write the kernel cache {target.parent} ({error})"
    command = [compiler, *flags, "-shared", str(source), "-o", scratch, "-lm"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as error:
        Path(scratch).unlink(missing_ok=True)
        return f"{Path(compiler).name} failed to run ({error})"
    if done.returncode != 0:
        Path(scratch).unlink(missing_ok=True)
        errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines() or ["?"]
        return f"{Path(compiler).name} could not build {source.name}: {errors[0].strip()}"
    os.replace(scratch, target)
    return ""


def address(t: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> int | None:
    """A tensor's address for the C code, or NULL for None: it must be a contiguous CPU tensor of ``dtype``."""
    if t is None:
        return None
    if t.dtype != dtype or not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError(f"the C code takes contiguous {dtype} CPU tensors, got {t.dtype} {tuple(t.shape)}")
    return t.data_ptr()
