"""What this CPU can run fast, read once: torch's own vector-capability query and the kernel's CPU flags.

The fast precision (core/engine/plan.py) needs two facts. bf16 matmuls are fast only with AMX or AVX512-BF16
(without them oneDNN emulates bf16 and is slower than float32). torch's int8 weight-only kernel
(``_weight_int8pack_mm``) is vectorised for AVX-512 builds; on an AVX2-only CPU it measured 3-10x slower than
the packed float32 path. Both facts are read here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

# the /proc/cpuinfo flags that make bf16 matmuls fast, with the names people know them by
BF16_INSTRUCTIONS = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuFeatures:
    capability: str  # torch's vector capability for this CPU: "DEFAULT", "AVX2", "AVX512", ...
    flags: frozenset[str]  # the kernel's CPU flags (empty where /proc/cpuinfo does not exist)

    @property
    def bf16_instructions(self) -> tuple[str, ...]:
        """The bf16 instructions this CPU has, by their common names (empty: none)."""
        return tuple(name for flag, name in BF16_INSTRUCTIONS.items() if flag in self.flags)

    @property
    def missing_bf16_instructions(self) -> tuple[str, ...]:
        return tuple(name for flag, name in BF16_INSTRUCTIONS.items() if flag not in self.flags)

    @property
    def int8_kernel_vectorised(self) -> bool:
        """torch's int8 weight-only kernel has its vectorised path in the AVX-512 build of its kernels."""
        return self.capability.upper().startswith("AVX512")


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
