"""The paged decode kernels compiled for an H200 (sm_90a) on a machine without a GPU: registers, spills and
shared memory per tile (ptxas), and the instructions in the main loop per KB of KV read, from the SASS.

Needs triton with its NVIDIA backend (it carries ptxas and cuobjdump); no CUDA device. At the benchmark's
shape (16 query / 8 KV heads, head dim 128, page 16, fp8 pages, float16 products, bf16 queries):

    python3 scripts/paged_decode_sass.py                 # TILES[True] and the all-heads tiles of the sweep
    python3 scripts/paged_decode_sass.py 64,4,2,head 32,8,2,diag 16,8,2,dots

A tile is ``tokens,warps,stages,kind`` with kind ``head`` (the per-head kernel, 128 registers as
TILES[True]), ``diag`` (all heads, block-diagonal product) or ``dots`` (all heads, products per KV head).
Warp instructions per KB = loop instructions per warp * warps / KB per iteration: a static count of the work
per byte (what bounds the fp8 kernels), not a timing.
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from core.kernels.paged_decode_rows_triton import paged_decode_head_dots_kernel, paged_decode_rows_kernel
from core.kernels.paged_decode_triton import paged_decode_kernel

HEADS, KV_HEADS, DIM, PAGE = 16, 8, 128, 16
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
POINTERS = {"q_ptr": "*bf16", "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv", "k_scale_ptr": "*fp32",
            "v_scale_ptr": "*fp32", "kv_indptr_ptr": "*i32", "kv_indices_ptr": "*i32", "kv_last_ptr": "*i32",
            "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "counter_ptr": "*i32", "out_ptr": "*bf16"}
DEFAULT = ["64,4,2,head", "16,8,2,dots", "16,8,3,dots", "32,8,2,dots", "32,8,3,dots", "16,8,2,diag",
           "32,8,2,diag"]


def compile_ptx(kind: str, tokens: int, warps: int, stages: int) -> tuple[str, int]:
    """(PTX, shared memory bytes) of one tile, for sm_90a."""
    common = dict(NUM_HEADS=HEADS, NUM_KV_HEADS=KV_HEADS, HEAD_DIM=DIM, PAGE_SIZE=PAGE, GROUP=HEADS // KV_HEADS,
                  BLOCK_T=tokens, SPLITS=1, FP8=True, F16=True, DOT_PRECISION="tf32")
    options = {"num_warps": warps, "num_stages": stages}
    if kind == "head":
        fn, constants = paged_decode_kernel, dict(common, BLOCK_G=16)
        options["maxnreg"] = 128
    elif kind == "diag":
        fn, constants = paged_decode_rows_kernel, dict(common, BLOCK_H=16, BLOCK_ROW=KV_HEADS * DIM)
    else:
        fn, constants = paged_decode_head_dots_kernel, dict(common, BLOCK_KV=KV_HEADS, BLOCK_G=HEADS // KV_HEADS)
    signature = dict(POINTERS, sm_scale="fp32", **{name: "constexpr" for name in constants})
    aligned = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in POINTERS}
    kernel = triton.compile(ASTSource(fn, signature, constants, aligned), target=GPUTarget("cuda", 90, 32),
                            options=options)
    return kernel.asm["ptx"], kernel.metadata.shared


def main_loop(sass: str) -> list[str]:
    """The instructions of the longest backward branch's body: the loop over the cached tokens."""
    code = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    index = {address: i for i, (address, _) in enumerate(code)}
    best = (0, 0)
    for i, (address, text) in enumerate(code):
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address and int(target.group(1), 16) in index:
            start = index[int(target.group(1), 16)]
            best = max(best, (start, i + 1), key=lambda span: span[1] - span[0])
    return [text for _, text in code[best[0]:best[1]]]


def report(spec: str) -> str:
    tokens, warps, stages, kind = spec.split(",")
    tokens, warps, stages = int(tokens), int(warps), int(stages)
    ptx, shared = compile_ptx(kind, tokens, warps, stages)
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        ptx_path.write_text(ptx)
        ptxas = subprocess.run([TOOLS / "ptxas", "-v", "--gpu-name", "sm_90a", ptx_path, "-o", cubin],
                               capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([TOOLS / "cuobjdump", "-sass", cubin], capture_output=True, text=True,
                              check=True).stdout
    registers = re.search(r"Used (\d+) registers", ptxas).group(1)
    spills = re.search(r"(\d+) bytes spill stores", ptxas).group(1)
    loop = main_loop(sass)
    kb = tokens * DIM * 2 / 1024 * (1 if kind == "head" else KV_HEADS)  # K and V, one byte a value
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0] for text in loop)
    top = ", ".join(f"{op} {n}" for op, n in ops.most_common(8))
    return (f"{spec:<16} registers {registers:>3}, spill stores {spills:>4} B, shared {shared // 1024:>3} KB; "
            f"loop {len(loop):>5} instructions a warp, {len(loop) * warps / kb:5.0f} a KB ({top})")


def main() -> None:
    for spec in sys.argv[1:] or DEFAULT:
        print(report(spec), flush=True)


if __name__ == "__main__":
    main()
