"""The whole GPU check in one process: kernel builds, GPU tests, correctness on the real shape, benchmarks.

Run through scripts/gpu_check.sh on a CUDA machine. Every step is guarded: a failure is recorded with its
reason and the next step still runs; a step that would not fit in the time left is skipped and says so. The
last thing printed is a summary table; everything (log, pytest output, figures as JSON) also goes to --out.

    python scripts/gpu_check.py --out out/gpu --budget 500     # on the GPU
    python scripts/gpu_check.py --smoke                         # the same code path on a CPU, tiny model
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402

from core import LLM, SamplingParams  # noqa: E402


@dataclass
class Row:
    step: str
    status: str  # PASS, FAIL, SKIP, INFO
    detail: str
    seconds: float


@dataclass
class Check:
    out: Path
    deadline: float
    smoke: bool
    rows: list[Row] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def left(self) -> float:
        return self.deadline - time.time()

    def step(self, name: str, fn: Callable[[], tuple[str, str] | str], need_s: float = 0.0) -> None:
        """Run one step; it returns a detail (PASS) or (status, detail). Exceptions become FAIL rows."""
        if self.left() < need_s:
            self.rows.append(Row(name, "SKIP", f"needs ~{need_s:.0f}s, {max(self.left(), 0):.0f}s left", 0.0))
            print(f"== {name}: skipped (time)", flush=True)
            return
        print(f"== {name} ...", flush=True)
        start = time.time()
        try:
            result = fn()
            status, detail = result if isinstance(result, tuple) else ("PASS", result)
        except Exception as exc:  # noqa: BLE001 - one broken step must not hide the others
            traceback.print_exc()
            status, detail = "FAIL", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        row = Row(name, status, detail, time.time() - start)
        self.rows.append(row)
        print(f"== {name}: {status} ({row.seconds:.1f}s) {detail}", flush=True)
        # after every step: a crash later (a CUDA fault aborts the process) keeps what was measured
        (self.out / "figures.json").write_text(json.dumps(self.figures, indent=1, default=str))

    def table(self) -> str:
        width = max(len(r.step) for r in self.rows)
        lines = [f"{'step'.ljust(width)}  status  secs  detail", "-" * (width + 60)]
        lines += [f"{r.step.ljust(width)}  {r.status.ljust(6)}  {r.seconds:4.0f}  {r.detail}" for r in self.rows]
        return "\n".join(lines)


# ---- environment and kernel builds --------------------------------------------------------------------------
def env_info(check: Check) -> str:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    try:
        import flashinfer

        info["flashinfer"] = flashinfer.__version__
    except Exception as exc:  # noqa: BLE001
        info["flashinfer"] = f"missing ({type(exc).__name__})"
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        pass
    commit_file = ROOT / "COMMIT"  # a copy of the tree without .git (as sent to a lent GPU) names its commit here
    info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip() or (commit_file.read_text().strip()
                                                                  if commit_file.exists() else "unknown")
    check.figures["env"] = info
    return ", ".join(f"{k} {v}" for k, v in info.items())


def warm_kernels(check: Check) -> str:
    """Build every flashinfer module the engine uses at once (each build is a separate ninja run, so in
    parallel they share the cores) and compile the sampler, instead of paying for them one after another."""
    from core.attention.flashinfer_backend import FlashInferBackend
    from core.kernels.dispatch import FlashInferKernels
    from core.layers.rope import RotaryEmbedding
    from core.models.config import RopeScaling

    dev = torch.device("cuda")
    x = torch.randn(4, 1024, dtype=torch.bfloat16, device=dev)
    w = torch.ones(1024, dtype=torch.bfloat16, device=dev)

    def attention(phase: str) -> None:
        from core.kvcache.pool import KVPool
        from core.request import Batch, Req

        pool = KVPool(1, 8, 16, 8, 128, torch.bfloat16, dev)
        table = torch.arange(64, device=dev).repeat(2, 1)
        backend = FlashInferBackend(pool, table, 16, 8, 128)
        req = Req(uid=0, input_ids=[0] * 5, prompt_len=5, table_idx=0, cached_len=0 if phase == "prefill" else 4,
                  device_len=5, max_device_len=9, params=SamplingParams(), sample_seed=0)
        n = req.extend_len
        batch = Batch([req], phase, positions=torch.arange(5 - n, 5, device=dev),
                      out_loc=torch.arange(5 - n, 5, device=dev))
        backend.prepare_metadata(batch)
        backend.begin_forward(batch)
        q = torch.randn(n, 16, 128, dtype=torch.bfloat16, device=dev)
        kv = torch.randn(n, 8, 128, dtype=torch.bfloat16, device=dev)
        backend.forward(q, kv, kv, 0, batch)

    def rope() -> None:
        r = RotaryEmbedding(128, 64, 1e6, RopeScaling()).to(dev)
        q = torch.randn(4, 16, 128, dtype=torch.bfloat16, device=dev)
        FlashInferKernels.rope(torch.arange(4, device=dev), q, q[:, :8].clone(), r.cos, r.sin, r.cos_sin)

    jobs = {"prefill": lambda: attention("prefill"), "decode": lambda: attention("decode"),
            "norm": lambda: (FlashInferKernels.rms_norm(x, w, 1e-6),
                             FlashInferKernels.add_rms_norm(x.clone(), x.clone(), w, 1e-6)),
            "silu": lambda: FlashInferKernels.silu_and_mul(x), "rope": rope}
    times: dict[str, str] = {}

    def run(name: str, fn: Callable) -> None:
        start = time.time()
        try:
            fn()
            torch.cuda.synchronize()
            times[name] = f"{time.time() - start:.0f}s"
        except Exception as exc:  # noqa: BLE001
            times[name] = f"FAILED {type(exc).__name__}: {str(exc)[:120]}"
            traceback.print_exc()

    threads = [threading.Thread(target=run, args=item) for item in jobs.items()]
    for t in threads:
        t.start()
    run("sampler-compile", _warm_sampler)  # dynamo in the main thread while ninja builds run
    for t in threads:
        t.join()
    detail = ", ".join(f"{k} {v}" for k, v in times.items())
    return ("FAIL" if "FAILED" in detail else "PASS"), detail


def _warm_sampler() -> None:
    from core.engine.sampler import Sampler, SampleArgs

    dev = torch.device("cuda")
    s = Sampler(dev)
    logits = torch.randn(3, 1000, device=dev)
    s.sample(logits, SampleArgs(temperatures=torch.ones(3, device=dev), top_k=torch.full((3,), -1, device=dev),
                                top_p=torch.ones(3, device=dev), seeds=torch.arange(3, device=dev),
                                positions=torch.arange(3, device=dev), greedy_rows=torch.zeros(3, dtype=torch.bool,
                                                                                                device=dev)))


# ---- tests ------------------------------------------------------------------------------------------------
def run_pytest(check: Check) -> tuple[str, str]:
    junit = Path("/tmp/minisgl-pytest.xml")
    # the GPU tests, and the Triton kernels' tests (which run on a CPU only under Triton's interpreter)
    kernel_tests = ["tests/test_fused_qkv.py", "tests/test_gemv.py", "tests/test_small_decode.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "tests/gpu", *kernel_tests, f"--junitxml={junit}", "-p",
           "no:cacheprovider"]
    timeout = max(check.left() - 240, 60)  # leave the benchmarks their time
    with open(check.out / "pytest.log", "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    tail = (check.out / "pytest.log").read_text().strip().splitlines()
    summary = tail[-1] if tail else "no output"
    for row in _junit_rows(junit):
        check.rows.append(row)
    return ("PASS" if proc.returncode == 0 else "FAIL"), summary


def _junit_rows(path: Path) -> list[Row]:
    import xml.etree.ElementTree as ET

    if not path.exists():
        return []
    rows = []
    for case in ET.parse(path).iter("testcase"):
        name = "  " + case.get("name", "?")
        status, detail = "PASS", ""
        for tag, label in (("failure", "FAIL"), ("error", "FAIL"), ("skipped", "SKIP")):
            node = case.find(tag)
            if node is not None:
                status, detail = label, (node.get("message") or "").splitlines()[0][:160] if node.get("message") else ""
        rows.append(Row(name, status, detail, float(case.get("time", 0))))
    return rows


# ---- correctness on the real shape ---------------------------------------------------------------------------
def backends_agree_on_real_shape(check: Check) -> tuple[str, str]:
    from gpu.compare import near_tie_compare

    rng = random.Random(1)
    model = "random:tiny-qwen3" if check.smoke else "random:qwen3-0.6b"
    prompts = [[rng.randrange(10000 if not check.smoke else 256) for _ in range(rng.randint(20, 300))]
               for _ in range(12)]
    lengths = [rng.randint(8, 48) for _ in prompts]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    common = dict(max_running_req=8, page_size=16, max_seq_len=1024, kv_cache_gb=4.0)
    ref = LLM(model, attention="torch", cuda_graph_max_bs=0, **common)
    if check.smoke:
        fast = LLM(model, attention="torch", cuda_graph_max_bs=0, **common)
    else:
        fast = LLM(model, attention="flashinfer", **common)  # graphs on, fused kernels
    outs_ref = [r["token_ids"] for r in ref.generate(prompts, params)]
    outs_fast = [r["token_ids"] for r in fast.generate(prompts, params)]
    verdict = near_tie_compare(ref, fast, prompts, outs_ref, outs_fast)
    check.figures["real_shape_agreement"] = {"verdict": str(verdict), "details": verdict.details}
    return ("PASS" if verdict.ok else "FAIL"), f"torch vs flashinfer+graphs, {model}, bf16: {verdict}"


def overlap_agrees_on_real_shape(check: Check) -> tuple[str, str]:
    """The overlap loop against the plain loop on one flashinfer engine with graphs, queueing included."""
    from gpu.compare import near_tie_compare

    rng = random.Random(2)
    model = "random:tiny-qwen3" if check.smoke else "random:qwen3-0.6b"
    prompts = [[rng.randrange(10000 if not check.smoke else 256) for _ in range(rng.randint(20, 300))]
               for _ in range(24)]
    params = [SamplingParams(max_tokens=rng.randint(8, 64), ignore_eos=True) for _ in prompts]
    llm = LLM(model, max_running_req=8, page_size=16, max_seq_len=1024, kv_cache_gb=4.0, max_extend_tokens=512)
    llm.overlap = False
    plain = [r["token_ids"] for r in llm.generate(prompts, params)]
    llm.overlap = True
    over = [r["token_ids"] for r in llm.generate(prompts, params)]
    verdict = near_tie_compare(llm, llm, prompts, plain, over)
    stats = llm.stats()
    leaks = stats["free_rows"] != stats["total_rows"] or stats["free_pages"] + stats["cached_pages"] != stats["total_pages"]
    check.figures["overlap_agreement"] = {"verdict": str(verdict), "details": verdict.details, "stats": stats}
    ok = verdict.ok and not leaks
    return ("PASS" if ok else "FAIL"), f"overlap on vs off, {model}, 24 requests over 8 rows: {verdict}" + \
        (", rows or pages leaked" if leaks else ", no leak")


def profile_host(check: Check, state: BenchState) -> str:
    """Where the host's time goes per step (cProfile), at batch 1 and at batch 256: written to
    host_profile.txt, the top entries printed."""
    import cProfile
    import io
    import pstats

    llm = state.llm
    if llm is None:
        return "SKIP", "no engine"
    llm.overlap = True
    rng = random.Random(4)
    vocab = min(10000, llm.vocab_size)
    out = io.StringIO()
    summary = []
    for name, prompts, params in (
            ("batch 1, 200 tokens", [[rng.randrange(vocab) for _ in range(128)]],
             [SamplingParams(max_tokens=200, ignore_eos=True)]),
            ("batch 256, 24 tokens, temperature 0.6", [[rng.randrange(vocab) for _ in range(100)] for _ in range(256)],
             [SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.6)] * 256)):
        steps: list = []
        llm.add_step_callback(steps.append)
        profile = cProfile.Profile()
        profile.enable()
        llm.generate(prompts, params)
        profile.disable()
        llm.step_callbacks.remove(steps.append)
        decode = [e.elapsed_s for e in steps if e.phase == "decode"]
        per_step = statistics.median(decode) * 1e3 if decode else float("nan")
        summary.append(f"{name}: {per_step:.2f} ms/step under the profiler")
        out.write(f"==== {name}: {len(decode)} decode steps, median {per_step:.2f} ms under the profiler\n")
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(30)
    (check.out / "host_profile.txt").write_text(out.getvalue())
    print(out.getvalue()[:6000])
    return "; ".join(summary)


# ---- benchmarks ----------------------------------------------------------------------------------------------
def nanovllm_workload(n: int = 256, seed: int = 0, min_len: int = 100, max_len: int = 1024,
                      max_id: int = 10000) -> tuple[list[list[int]], list[SamplingParams]]:
    """nano-vllm's benchmark: random prompt ids in [0, 10000), prompt length and max_tokens uniform in
    [100, max_len], temperature 0.6, EOS ignored, Python's random seeded with 0 (prompts drawn first)."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, max_id) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)]
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=rng.randint(min_len, max_len))
              for _ in range(n)]
    return prompts, params


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "mean": statistics.fmean(values)}


class BenchState:
    llm: LLM | None = None


def bench_engine(check: Check, state: BenchState, page_size: int, overlap: bool = True,
                 max_warmup_step_ms: float | None = None) -> str | tuple[str, str]:
    """The nanovllm workload on one engine; ``overlap=False`` runs the same engine with the plain loop.
    With ``max_warmup_step_ms``, a warm-up slower than that per step skips the measurement (it would not
    finish in the time left)."""
    model = "random:tiny-qwen3" if check.smoke else "random:qwen3-0.6b"
    n = 8 if check.smoke else 256
    max_len = 40 if check.smoke else 1024
    if state.llm is None or state.llm.config.page_size != page_size:
        state.llm = None
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        start = time.time()
        max_seq_len = 512 if check.smoke else 2 * max_len + 8
        state.llm = LLM(model, max_running_req=n, page_size=page_size, max_seq_len=max_seq_len, log=print)
        check.figures[f"engine_start_s_ps{page_size}"] = round(time.time() - start, 1)
    llm = state.llm
    llm.overlap = overlap and (torch.cuda.is_available() or check.smoke)
    prompts, params = nanovllm_workload(n, min_len=10 if check.smoke else 100, max_len=max_len,
                                        max_id=255 if check.smoke else 10000)
    # warm-up: a short run of the same kind (prefill, decode graphs, seeded sampling)
    warm_steps: list = []
    llm.add_step_callback(warm_steps.append)
    llm.generate(prompts[:16], [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=32)] * len(prompts[:16]))
    llm.step_callbacks.remove(warm_steps.append)
    warm_ms = statistics.median(e.elapsed_s for e in warm_steps if e.phase == "decode") * 1e3
    if max_warmup_step_ms is not None and warm_ms > max_warmup_step_ms:
        return "SKIP", f"warm-up decode step {warm_ms:.1f} ms at batch 16 (> {max_warmup_step_ms} ms): too slow to run"
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    counts: dict[int, int] = {}
    start_box = [0.0]

    def on_reply(reply) -> None:
        now = time.perf_counter()
        if reply.token is not None:
            first.setdefault(reply.uid, now)
            last[reply.uid] = now
            counts[reply.uid] = counts.get(reply.uid, 0) + 1

    steps: list = []
    llm.add_reply_callback(on_reply)
    llm.add_step_callback(steps.append)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start_box[0] = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - start_box[0]
    llm._reply_callbacks.remove(on_reply)
    llm.step_callbacks.remove(steps.append)
    total = sum(p.max_tokens for p in params)
    produced = sum(len(o["token_ids"]) for o in outs)
    assert produced == total, f"produced {produced} tokens, expected {total}"
    ttft = [first[u] - start_box[0] for u in first]
    tpot = [(last[u] - first[u]) / (counts[u] - 1) for u in first if counts[u] > 1]
    decode_steps = [e for e in steps if e.phase == "decode"]
    prefill_steps = [e for e in steps if e.phase == "prefill"]
    fig = {"requests": n, "output_tokens": total, "prompt_tokens": sum(map(len, prompts)), "wall_s": round(wall, 3),
           "tok_per_s": round(total / wall, 1), "ttft_s": _percentiles(ttft), "tpot_ms": {
               k: v * 1e3 for k, v in _percentiles(tpot).items()},
           "decode_steps": len(decode_steps), "prefill_steps": len(prefill_steps),
           "decode_step_ms": {k: v * 1e3 for k, v in _percentiles([e.elapsed_s for e in decode_steps]).items()},
           "prefill_time_s": round(sum(e.elapsed_s for e in prefill_steps), 3),
           "decode_time_s": round(sum(e.elapsed_s for e in decode_steps), 3),
           "peak_batch": max((e.batch_size for e in decode_steps), default=0)}
    fig["overlap"] = llm.overlap
    check.figures[f"nanovllm_ps{page_size}" + ("" if overlap else "_plain")] = fig
    return (f"{fig['tok_per_s']:.0f} tok/s ({total} tok in {wall:.1f}s), TTFT p50 {fig['ttft_s']['p50']:.2f}s, "
            f"TPOT p50 {fig['tpot_ms'].get('p50', 0):.2f}ms, decode step p50 {fig['decode_step_ms']['p50']:.2f}ms "
            f"over {len(decode_steps)} steps, prefill {fig['prefill_time_s']:.1f}s")


def bench_batch1(check: Check, state: BenchState, graphs: bool = True, overlap: bool = True) -> str:
    """Per-token latency of one request decoding alone (greedy), from the decode steps' wall times."""
    model = "random:tiny-qwen3" if check.smoke else "random:qwen3-0.6b"
    if graphs and state.llm is not None:
        llm = state.llm
    else:
        llm = LLM(model, max_running_req=1, page_size=16, max_seq_len=1024, kv_cache_gb=2.0,
                  cuda_graph_max_bs=None if graphs else 0)
    llm.overlap = overlap and (torch.cuda.is_available() or check.smoke)
    prompt = [random.Random(3).randint(0, 255) for _ in range(128)]
    steps: list = []
    llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True))  # warm-up
    llm.add_step_callback(steps.append)
    start = time.perf_counter()
    out = llm.generate([prompt], SamplingParams(max_tokens=257, ignore_eos=True))[0]
    assert out["finish_reason"] == "length", out
    wall = time.perf_counter() - start
    llm.step_callbacks.remove(steps.append)
    decode = sorted(e.elapsed_s for e in steps if e.phase == "decode")
    median_ms = statistics.median(decode) * 1e3
    key = "batch1" + ("" if graphs else "_eager") + ("" if overlap else "_plain")
    check.figures[key] = {"median_ms_per_token": round(median_ms, 3), "p90_ms": round(decode[int(0.9 * len(decode))] * 1e3, 3),
                          "tokens": 257, "wall_s": round(wall, 3), "overlap": llm.overlap}
    return f"median {median_ms:.3f} ms/token (p90 {check.figures[key]['p90_ms']:.3f}), 257 tokens in {wall:.2f}s"


def bench_transformers(check: Check, state: BenchState, n: int) -> str:
    """transformers' static batched generate (padded) on the first n requests of the same workload."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    state.llm = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    smoke = check.smoke
    cfg = Qwen3Config(vocab_size=320 if smoke else 151936, hidden_size=64 if smoke else 1024,
                      intermediate_size=128 if smoke else 3072, num_hidden_layers=2 if smoke else 28,
                      num_attention_heads=4 if smoke else 16, num_key_value_heads=2 if smoke else 8,
                      head_dim=16 if smoke else 128, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      max_position_embeddings=4096, rope_theta=1e6)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    prompts, params = nanovllm_workload(256 if not smoke else 8, min_len=10 if smoke else 100,
                                        max_len=40 if smoke else 1024, max_id=255 if smoke else 10000)
    prompts, params = prompts[:n], params[:n]
    width = max(map(len, prompts))
    ids = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding, as batched generation needs
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    new = max(p.max_tokens for p in params)
    kwargs = dict(do_sample=True, temperature=0.6, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model.generate(input_ids=ids[:, -8:], attention_mask=mask[:, -8:], max_new_tokens=4, min_new_tokens=4,
                       **kwargs)  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        max_time = max(min(check.left() - 30, 45), 10)
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                             max_time=max_time, **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    steps = out.shape[1] - width
    useful = sum(min(p.max_tokens, steps) for p in params)
    fig = {"requests": n, "useful_tokens": useful, "steps": steps, "of_steps": new, "wall_s": round(wall, 3),
           "tok_per_s": round(useful / wall, 1), "cut_by_max_time": steps < new}
    check.figures["transformers_static"] = fig
    engine = check.figures.get("nanovllm_ps16") or check.figures.get("nanovllm_ps1")
    ratio = f", engine/transformers {engine['tok_per_s'] / fig['tok_per_s']:.1f}x" if engine else ""
    cut = f" (stopped at {steps}/{new} steps by max_time)" if steps < new else ""
    return f"{fig['tok_per_s']:.0f} tok/s on {n} requests{cut}{ratio}"


def headline(fig: dict[str, Any]) -> str:
    """The figures that matter, on one line each, against the targets."""
    lines = [f"device: {fig.get('env', {}).get('device')}, commit {fig.get('env', {}).get('commit')}"]
    for key in ("nanovllm_ps16", "nanovllm_ps16_plain", "nanovllm_ps1"):
        if key in fig:
            f = fig[key]
            lines.append(f"{key}: {f['tok_per_s']:.0f} tok/s (target >= 20000), wall {f['wall_s']}s, "
                         f"decode {f['decode_time_s']}s over {f['decode_steps']} steps, prefill {f['prefill_time_s']}s")
    for key in ("batch1", "batch1_plain", "batch1_eager"):
        if key in fig:
            lines.append(f"{key}: {fig[key]['median_ms_per_token']} ms/token (target <= 1.0)")
    if "transformers_static" in fig:
        lines.append(f"transformers static: {fig['transformers_static']['tok_per_s']} tok/s")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "out" / "gpu"))
    parser.add_argument("--budget", type=float, default=520.0, help="seconds for the whole check")
    parser.add_argument("--hf-requests", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="run the same steps on a CPU with a tiny model")
    parser.add_argument("--skip-pytest", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, time.time() + args.budget, args.smoke)
    gpu = torch.cuda.is_available()
    check.step("environment", lambda: env_info(check))
    if not gpu and not args.smoke:
        check.rows.append(Row("cuda", "FAIL", "no CUDA device; use --smoke for a CPU dry run", 0))
    else:
        if gpu:
            check.step("build flashinfer kernels + compile sampler", lambda: warm_kernels(check), need_s=60)
            if not args.skip_pytest:
                check.step("pytest tests/gpu + kernel tests", lambda: run_pytest(check), need_s=150)
        check.step("torch vs flashinfer, real shape", lambda: backends_agree_on_real_shape(check), need_s=60)
        check.step("overlap on vs off, real shape", lambda: overlap_agrees_on_real_shape(check), need_s=40)
        state = BenchState()
        check.step("bench nanovllm, page 16", lambda: bench_engine(check, state, 16), need_s=60)
        check.step("bench nanovllm, page 16, overlap off", lambda: bench_engine(check, state, 16, overlap=False),
                   need_s=45)
        check.step("bench batch-1 decode, graphs", lambda: bench_batch1(check, state, True), need_s=15)
        check.step("bench batch-1 decode, graphs, overlap off", lambda: bench_batch1(check, state, True, False),
                   need_s=15)
        check.step("bench batch-1 decode, eager", lambda: bench_batch1(check, BenchState(), False), need_s=40)
        if gpu:
            check.step("profile host work per step", lambda: profile_host(check, state), need_s=40)
        check.step("bench nanovllm, page 1",
                   lambda: bench_engine(check, state, 1, max_warmup_step_ms=None if check.smoke else 15.0),
                   need_s=100)
        check.step(f"transformers static generate, {args.hf_requests} req",
                   lambda: bench_transformers(check, state, args.hf_requests), need_s=60)
    (out / "figures.json").write_text(json.dumps(check.figures, indent=1, default=str))
    table = check.table()
    print("\n" + table)
    print("\n" + headline(check.figures))
    return 1 if any(r.status == "FAIL" for r in check.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
