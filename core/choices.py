"""The named choices of the engine's options, apart from the engine so that listing them imports no torch
(the command line's help names them)."""

from core.errors import InvalidParamsError

CACHE_TYPES = ("naive", "radix")
KV_DTYPES = ("auto", "fp8")  # 'auto': the model's dtype
ATTENTION_BACKENDS = ("torch", "flashinfer")
# 'exact': the model's dtype (float32 on a CPU, token-exact); 'fast': reduced-precision weights where this
# machine runs them faster (decided in core/engine/plan.py); 'int8': int8 weights on a CPU whatever the machine
PRECISIONS = ("exact", "fast", "int8")
# the names a dtype may be given by; core/config.py maps them to torch dtypes
DTYPE_NAMES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")


def check_dtype_name(value: str) -> str:
    """The lower-cased name, or InvalidParamsError naming the choices."""
    name = str(value).lower()
    if name not in DTYPE_NAMES:
        raise InvalidParamsError(f"unknown dtype {value!r}; use one of {', '.join(DTYPE_NAMES)}")
    return name
