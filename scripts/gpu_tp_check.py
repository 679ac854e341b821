"""Tensor-parallel check on a machine with two GPUs: tp=2 over NCCL gives tp=1's greedy tokens.

    python scripts/gpu_tp_check.py                         # Qwen3-0.6B shape, random weights, bf16 and fp32
    python scripts/gpu_tp_check.py --model PATH --tp 2     # a real checkpoint
    python scripts/gpu_tp_check.py --kill-test             # also: a worker killed mid-run raises WorkerError

Prompts are token ids (no tokenizer needed). One GPU and two sum in a different order (the all-reduce), which
can flip a greedy near-tie, in bf16 often and in float32 rarely; so for both the rule is ``minisgl verify``'s
near-tie rule, and the exact matches are counted apart: at the first differing position both tokens must be
within the reference's top-5 (the reference: transformers on the same weights, one prompt at a time) and the
comparison stops there.
Prints one line per case and a summary; exits non-zero if any prompt fails.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from core import LLM, SamplingParams, WorkerError

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, max_position_embeddings=40960)


def model_spec(spec: str) -> str:
    """For ``random:qwen3-0.6b``, a random checkpoint of that shape saved once; other specs are paths."""
    if not spec.startswith("random:"):
        return spec
    # a checkpoint on disk, so transformers (the top-5 reference) reads the very weights the engine runs
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "minisgl-random-qwen3-0.6b"
    if not (path / "config.json").is_file():
        from transformers import AutoModelForCausalLM, Qwen3Config

        torch.manual_seed(0)
        config = Qwen3Config(**QWEN3_06B, eos_token_id=151645, bos_token_id=151643)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(path)
        _save_byte_tokenizer(path)
    return str(path)


def _save_byte_tokenizer(path: Path) -> None:
    """The LLM loads a tokenizer even for token-id prompts: give the random checkpoint a trivial one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(path)


def make_prompts(n: int, seed: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(10000) for _ in range(rng.randint(4, 200))] for _ in range(n)]
    return prompts, [rng.randint(8, 48) for _ in range(n)]


def run(model: str, tp: int, dtype: str, prompts, max_tokens, kv_gb: float) -> tuple[list[list[int]], float]:
    llm = LLM(model, tp=tp, dtype=dtype, kv_cache_gb=kv_gb, max_running_req=64)
    try:
        start = time.perf_counter()
        out = llm.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens])
        elapsed = time.perf_counter() - start
    finally:
        llm.close()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    return [r["token_ids"] for r in out], elapsed


def top5(model: str, dtype: str, context: list[int]) -> set[int]:
    from transformers import AutoModelForCausalLM

    global _REF
    if _REF is None or _REF[0] != (model, dtype):
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).cuda().eval()
        _REF = ((model, dtype), hf)
    with torch.no_grad():
        logits = _REF[1](torch.tensor([context], device="cuda")).logits[0, -1]
    return set(logits.topk(5).indices.tolist())


_REF = None


def compare(model: str, dtype: str, prompts, ones, twos) -> dict[str, int]:
    counts = {"exact": 0, "near_tie": 0, "fail": 0}
    for i, (prompt, a, b) in enumerate(zip(prompts, ones, twos)):
        if a == b:
            counts["exact"] += 1
            continue
        pos = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if pos >= min(len(a), len(b)):
            counts["fail"] += 1  # different lengths: never a near-tie
            print(f"  prompt {i}: lengths differ ({len(a)} vs {len(b)})")
            continue
        allowed = top5(model, dtype, prompt + a[:pos])
        ok = a[pos] in allowed and b[pos] in allowed
        counts["near_tie" if ok else "fail"] += 1
        print(f"  prompt {i}: first difference at token {pos}: {a[pos]} vs {b[pos]} "
              f"({'both in the top-5' if ok else 'NOT a near-tie'})")
    return counts


def kill_test(model: str, tp: int) -> bool:
    """In a child process (a failed NCCL group may take its process down): kill rank 1 after a few steps."""
    code = f"""
import os, signal, time
from core import LLM, SamplingParams, WorkerError
if __name__ == "__main__":
    llm = LLM({model!r}, tp={tp}, kv_cache_gb=4)
    pid = llm.core.pids[0]
    llm.add_step_callback(lambda e: e.step == 3 and os.kill(pid, signal.SIGKILL))
    start = time.perf_counter()
    try:
        llm.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=200, ignore_eos=True))
        print("NO ERROR")
    except WorkerError as exc:
        print(f"WorkerError after {{time.perf_counter() - start:.1f}} s: {{exc}}")
"""
    env = dict(os.environ, MINISGL_TP_TIMEOUT="60")
    try:
        # loading takes ~20 s and the collectives time out after 60: past 150 s the caller is hung
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150, env=env)
    except subprocess.TimeoutExpired:
        print("kill test: the caller hung for 150 s")
        return False
    print("kill test:", (done.stdout.strip() or done.stderr.strip()[-2000:]), f"(exit code {done.returncode})")
    return "WorkerError" in done.stdout and done.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random:qwen3-0.6b")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="comma-separated; empty ('') runs only the kill test")
    parser.add_argument("--kv-cache-gb", type=float, default=8.0)
    parser.add_argument("--kill-test", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    if torch.cuda.device_count() < args.tp:
        print(f"needs {args.tp} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    model = model_spec(args.model)
    prompts, max_tokens = make_prompts(args.prompts, seed=0)
    summary, ok = {}, True
    for dtype in filter(None, args.dtypes.split(",")):
        ones, t1 = run(model, 1, dtype, prompts, max_tokens, args.kv_cache_gb)
        twos, t2 = run(model, args.tp, dtype, prompts, max_tokens, args.kv_cache_gb)
        counts = compare(model, dtype, prompts, ones, twos)
        ok &= counts["fail"] == 0
        summary[dtype] = {**counts, "tp1_s": round(t1, 2), f"tp{args.tp}_s": round(t2, 2)}
        print(f"{dtype}: {counts['exact']} exact, {counts['near_tie']} near-tie, {counts['fail']} failed of "
              f"{len(prompts)} prompts; generate took {t1:.2f} s on 1 GPU, {t2:.2f} s on {args.tp}")
    if args.kill_test:
        summary["kill_test_ok"] = kill_test(model, args.tp)
        ok &= summary["kill_test_ok"]
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
