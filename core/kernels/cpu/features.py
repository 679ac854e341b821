"""What this CPU can run fast, read once: torch's own vector-capability query and the kernel's CPU flags.

The fast precision (core/engine/plan.py) reads them: bf16 matmuls pay only with AMX (with AVX512-BF16
alone, bf16 ran slower than float32), and the C decode step needs AVX2 and FMA
(core/kernels/cpu/decode.py). They are read here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuFeatures:
    capability: str  # torch's vector capability for this CPU: "DEFAULT", "AVX2", "AVX512", ...
    flags: frozenset[str]  # the kernel's CPU flags (empty where /proc/cpuinfo does not exist)

    @property
    def amx_bf16(self) -> bool:
        """AMX's bf16 tile products: the instructions that make bf16 weights faster than float32."""
        return "amx_bf16" in self.flags


def _cpuinfo_flags() -> frozenset[str]:
    try:
        text = CPUINFO.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, arm
            return frozenset(value.split())
    return frozenset()


@lru_cache(maxsize=1)
def cpu_features() -> CpuFeatures:
    return CpuFeatures(capability=torch.backends.cpu.get_cpu_capability(), flags=_cpuinfo_flags())
