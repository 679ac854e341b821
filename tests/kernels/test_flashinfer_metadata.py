"""The flashinfer backend's page metadata, checked on the CPU against a stand-in for flashinfer.

The stand-in implements what flashinfer's paged wrappers are documented to compute, from nothing but the
metadata they are planned with (page indices per request, tokens in the last page, query offsets; queries
aligned to the end of each sequence), in plain torch. If the engine fed flashinfer a wrong page list or
length, the stand-in would attend to the wrong keys and the tokens would differ from the torch backend's.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from core import LLM, SamplingParams
from core.kernels.cuda.attention.flashinfer_common import FlashInferBase
from core.kernels.cuda.attention.flashinfer_paged import FlashInferPagedBackend
from core.kernels.dispatch import TorchKernels
from tests.support.prompts import varied_prompts


class _Paged:
    def __init__(self, workspace, layout="NHD", use_cuda_graph=False, use_tensor_cores=False, **buffers):
        assert layout in ("NHD", "HND")
        self.layout = layout
        self.tensor_cores = use_tensor_cores
        # a graph's decode wrapper, as flashinfer's: plan copies the page lists into these, run reads them there
        self.buffers = (buffers.get("paged_kv_indptr_buffer"), buffers.get("paged_kv_indices_buffer"),
                        buffers.get("paged_kv_last_page_len_buffer")) if use_cuda_graph else (None,) * 3

    def plan(self, *args, **kwargs):
        if len(args) == 8:  # prefill: (qo_indptr, kv_indptr, indices, last_page_len, heads, kv_heads, dim, page)
            self.qo, self.indptr, self.indices, self.last = args[:4]
            self.page_size = args[7]
        else:  # decode: (kv_indptr, indices, last_page_len, heads, kv_heads, dim, page)
            self.indptr, self.indices, self.last = args[:3]
            self.page_size = args[6]
            self.qo = torch.arange(len(self.last) + 1, dtype=torch.int32)
            if self.buffers[0] is not None:
                indptr, indices, last = self.buffers
                indptr.copy_(self.indptr)
                indices[:len(self.indices)].copy_(self.indices)
                last.copy_(self.last)
        self.scale = kwargs["sm_scale"]

    def run(self, q, kv, out=None):
        """flashinfer's run: into ``out`` when given (rows it does not compute keep what they held)."""
        if self.buffers[0] is not None:  # what the buffers hold now, not what the last plan was given
            self.indptr, self.indices, self.last = self.buffers
        k_cache, v_cache = kv
        if self.layout == "HND":  # [pages, kv_heads, page, dim]: each page's tokens of one head side by side
            k_cache, v_cache = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        out = torch.empty_like(q) if out is None else out
        for i in range(len(self.last)):
            pages = self.indices[self.indptr[i]:self.indptr[i + 1]].long()
            kv_len = (len(pages) - 1) * self.page_size + int(self.last[i])
            k = k_cache[pages].flatten(0, 1)[:kv_len].transpose(0, 1)
            v = v_cache[pages].flatten(0, 1)[:kv_len].transpose(0, 1)
            lo, hi = int(self.qo[i]), int(self.qo[i + 1])
            q_pos = torch.arange(kv_len - (hi - lo), kv_len)
            mask = torch.arange(kv_len)[None, :] <= q_pos[:, None]
            o = F.scaled_dot_product_attention(q[lo:hi].transpose(0, 1), k, v, attn_mask=mask, scale=self.scale,
                                               enable_gqa=True)
            out[lo:hi] = o.transpose(0, 1)
        return out


class _WrapperPerSize(dict):
    """A graph wrapper for any batch size, made on first use (the CPU captures none), on the backend's shared page
    list buffers as init_cuda_graph makes them."""

    def __init__(self, backend: FlashInferPagedBackend, max_rows: int = 8) -> None:
        super().__init__()
        self.backend = backend
        backend._graph_indptr = torch.zeros(max_rows + 1, dtype=torch.int32)
        backend._graph_indices = torch.zeros(max_rows * 64, dtype=torch.int32)
        backend._graph_last = torch.zeros(max_rows, dtype=torch.int32)

    def __missing__(self, rows: int) -> _Paged:
        b = self.backend
        self[rows] = _Paged(None, use_cuda_graph=True, use_tensor_cores=b.tensor_cores(rows),
                            paged_kv_indptr_buffer=b._graph_indptr[:rows + 1], paged_kv_indices_buffer=b._graph_indices,
                            paged_kv_last_page_len_buffer=b._graph_last[:rows])
        return self[rows]


def _fake_flashinfer() -> types.ModuleType:
    fi = types.ModuleType("flashinfer")
    fi.BatchPrefillWithPagedKVCacheWrapper = _Paged
    fi.BatchDecodeWithPagedKVCacheWrapper = _Paged
    norm, act, rope = (types.ModuleType(f"flashinfer.{n}") for n in ("norm", "activation", "rope"))
    norm.rmsnorm = TorchKernels.rms_norm

    def fused_add_rmsnorm(x, residual, weight, eps):
        residual += x
        x.copy_(TorchKernels.rms_norm(residual, weight, eps))

    norm.fused_add_rmsnorm = fused_add_rmsnorm
    act.silu_and_mul = TorchKernels.silu_and_mul

    def apply_rope(positions, q, k, head_size, cos_sin, is_neox=True):
        half = cos_sin.shape[-1] // 2
        cos = torch.cat([cos_sin[:, :half]] * 2, -1)
        sin = torch.cat([cos_sin[:, half:]] * 2, -1)
        new_q, new_k = TorchKernels.rope(positions, q, k, cos, sin, cos_sin)
        q.copy_(new_q)
        k.copy_(new_k)

    rope.apply_rope_with_cos_sin_cache_inplace = apply_rope
    fi.norm, fi.activation, fi.rope = norm, act, rope
    return fi


@pytest.fixture
def fake_flashinfer(monkeypatch):
    fi = _fake_flashinfer()
    for name, module in {"flashinfer": fi, "flashinfer.norm": fi.norm, "flashinfer.activation": fi.activation,
                         "flashinfer.rope": fi.rope}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(FlashInferBase, "check_supported", staticmethod(lambda pool: None))


@pytest.mark.parametrize("page_size, cache, head_major", [(1, "naive", True), (4, "radix", True),
                                                         (16, "radix", True), (4, "radix", False)])
def test_flashinfer_metadata_gives_the_torch_backends_tokens(model_dirs, fake_flashinfer, monkeypatch, page_size,
                                                             cache, head_major):
    """The pool head-major (the plan's choice for this backend where the CPU's C decode step, which reads it
    token-major, is off) or token-major (switched off): the same tokens."""
    monkeypatch.setenv("MINISGL_DISABLE_CPU_DECODE", "1")
    if not head_major:
        monkeypatch.setenv("MINISGL_DISABLE_HEAD_MAJOR_KV", "1")
    path = model_dirs["qwen3"]
    prompts, max_tokens = varied_prompts(6, seed=11)
    prompts = prompts + [p + [1, 2] for p in prompts[:3]]  # shared prefixes for the radix cache
    max_tokens = max_tokens + max_tokens[:3]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
    kwargs = dict(max_running_req=3, page_size=page_size, cache=cache, device="cpu")  # on CUDA too: the stand-in
    ref = LLM(path, attention="torch", **kwargs).generate(prompts, params)
    fi_llm = LLM(path, attention="flashinfer", **kwargs)
    assert type(fi_llm.engine.attn_backend).__name__ == "FlashInferPagedBackend"
    assert fi_llm.engine.kv_pool.layout == ("HND" if head_major else "NHD")
    assert fi_llm.engine.model.model.norm.kernels.name == "flashinfer"
    got = fi_llm.generate(prompts, params)
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in ref]


def _shrinking_batches(model_dirs, seed: int) -> tuple[list, list, list, LLM]:
    """Four requests finishing one after another (decode batches of 4, 3, 2 and 1 rows): their prompts and
    parameters, the torch backend's results, and an engine on the flashinfer stand-in, not yet run."""
    prompts, _ = varied_prompts(4, seed=seed)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 6, 9, 12)]
    kwargs = dict(max_running_req=4, page_size=4, device="cpu")
    ref = LLM(model_dirs["qwen3"], attention="torch", **kwargs).generate(prompts, params)
    return prompts, params, ref, LLM(model_dirs["qwen3"], attention="flashinfer", **kwargs)


def test_large_decode_batches_run_on_tensor_cores_and_keep_the_tokens(model_dirs, fake_flashinfer, monkeypatch):
    """With the threshold at 3 rows, a run whose batches shrink from 4 rows to 1 plans both kinds of decode
    wrapper, each made with the kernel its size calls for, and the tokens stay the torch backend's (one row
    runs the CPU's C step, so the plain kernel is met at 2)."""
    monkeypatch.setenv("MINISGL_TENSOR_CORE_DECODE_ROWS", "3")
    prompts, params, ref, fi_llm = _shrinking_batches(model_dirs, seed=5)
    backend = fi_llm.engine.attn_backend
    assert fi_llm.engine.plan.tensor_core_decode_rows == 3
    assert [backend.tensor_cores(rows) for rows in (2, 3, 4)] == [False, True, True]
    got = fi_llm.generate(prompts, params)
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in ref]
    assert {k: w.tensor_cores for k, w in backend._decode_wrappers.items()} == {False: False, True: True}


def test_decode_batches_from_the_unsplit_size_are_planned_unsplit(model_dirs, fake_flashinfer, monkeypatch):
    """flashinfer's tensor-core plan gives each request one KV chunk from ``whole_request_rows`` rows: batches
    that large are planned with ``disable_split_kv``, once a size (later steps only copy their page lists into
    the graph's buffers), smaller ones as flashinfer chooses at every step; tokens unchanged."""
    from core.kernels.cuda.attention.flashinfer_paged import whole_request_rows

    assert whole_request_rows(132, 8) == 34 and whole_request_rows(132, 2) == 133
    prompts, params, ref, fi_llm = _shrinking_batches(model_dirs, seed=6)
    backend = fi_llm.engine.attn_backend
    assert fi_llm.engine.plan.whole_request_decode and backend.unsplit_rows > 4
    backend.unsplit_rows = 3  # the threshold of a device with few SMs
    planned = []
    real_plan = _Paged.plan
    # the CPU runs no CUDA graphs: every decode step plans as a graph's replay would, to see what it passes
    monkeypatch.setattr(backend, "begin_forward", lambda batch, graph=False:
                        FlashInferPagedBackend.begin_forward(backend, batch, graph=batch.is_decode))
    monkeypatch.setattr(backend, "_graph_wrappers", _WrapperPerSize(backend))

    def plan(self, *args, **kw):
        if len(args) == 7:  # a decode plan: (kv_indptr, indices, last_page_len, heads, kv_heads, dim, page)
            planned.append((len(args[2]), kw.get("disable_split_kv", False)))
        return real_plan(self, *args, **kw)

    monkeypatch.setattr(_Paged, "plan", plan)
    got = fi_llm.generate(prompts, params)
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in ref]
    assert set(planned) == {(4, True), (3, True), (2, False)}, planned
    # 4 rows decode for 2 steps, 3 rows for 3, 2 rows for 3: an unsplit size is planned at its first step only
    assert planned.count((4, True)) == 1 and planned.count((3, True)) == 1, planned
    assert planned.count((2, False)) == 3, planned


def test_whole_request_decode_can_be_turned_off(monkeypatch, model_dirs, fake_flashinfer):
    monkeypatch.setenv("MINISGL_DISABLE_WHOLE_REQUEST_DECODE", "1")
    llm = LLM(model_dirs["qwen3"], attention="flashinfer", max_running_req=2, device="cpu")
    assert not llm.engine.plan.whole_request_decode and not llm.engine.attn_backend.unsplit(256)


def test_tensor_core_decode_by_heads_and_rows():
    from core.kernels.cuda.attention.flashinfer_paged import use_tensor_core_decode

    assert use_tensor_core_decode(32, 8) and use_tensor_core_decode(32, 8, rows=1, min_rows=160)
    assert not use_tensor_core_decode(16, 8, rows=256)  # no threshold: the plain kernel
    assert [use_tensor_core_decode(16, 8, rows, 160) for rows in (128, 159, 160, 256)] == [False, False, True, True]


@pytest.mark.parametrize("raw", ["-1", "many", "1.5"])
def test_a_bad_tensor_core_threshold_is_refused(monkeypatch, raw):
    from core import env
    from core.errors import InvalidParamsError

    monkeypatch.setenv("MINISGL_TENSOR_CORE_DECODE_ROWS", raw)
    with pytest.raises(InvalidParamsError, match="MINISGL_TENSOR_CORE_DECODE_ROWS"):
        env.tensor_core_decode_rows()


def test_fp8_decode_splits_count_programs_per_request_for_the_all_heads_variant():
    """The per-head kernel runs a program per (request, KV head, split), the all-heads one per (request,
    split): at 64 rows and 8 KV heads that is 512 programs unsplit against 64, which 4 splits bring to 256."""
    from core.kernels.cuda.attention.flashinfer_fp8 import paged_splits

    assert [paged_splits(rows, 8) for rows in (1, 16, 64, 256)] == [4, 4, 1, 1]
    assert [paged_splits(rows, 8, all_heads=True) for rows in (1, 64, 128, 256)] == [4, 4, 2, 1]


class _EagerReplay:
    """A 'graph' that replays by running the captured pass again, on the same fixed buffers and the same
    wrapper (the CPU captures nothing): what the prefill graphs' inputs, padding and plan give, without CUDA."""

    replays: list[tuple[int, int]] = []  # (requests, query tokens) each replay was planned for, all graphs

    def __init__(self, runner, tokens: int) -> None:
        from core.attention.context import get_context

        self.runner, self.tokens, self.context = runner, tokens, get_context()
        self.logits = runner._forward(tokens)

    def replay(self) -> None:
        from core.attention.context import forward_context

        qo = self.runner.backend._prefill_graph_wrapper.qo
        self.replays.append((int((qo.diff() > 0).sum()), int(qo[-1])))
        with forward_context(self.context.batch, self.context.backend):
            self.logits.copy_(self.runner._forward(self.tokens))


def _record_eagerly(runner, tokens, device) -> tuple[_EagerReplay, torch.Tensor]:
    """Stands in for ``PrefillGraphRunner._record``: the 'graph' and the logits it fills."""
    graph = _EagerReplay(runner, tokens)
    return graph, graph.logits


def test_prefill_chunks_through_the_prefill_graphs_keep_the_tokens(model_dirs, fake_flashinfer, monkeypatch):
    """Every prefill chunk runs the smallest prefill graph that holds it (here replayed eagerly): the inputs go
    through the fixed buffers, the rows past a chunk's tokens compute stale inputs into the dummy slot, the
    request list is padded to the graphs' count with requests of no query tokens, the logits rows too. The
    tokens stay the torch backend's."""
    import core.engine.plan as plan_module
    from core.kernels.cuda.graphs.prefill import PrefillGraphRunner

    monkeypatch.setattr(plan_module, "prefill_graph_runs", lambda config, attention, *rest: attention == "flashinfer")
    monkeypatch.setattr(PrefillGraphRunner, "_record", _record_eagerly)
    monkeypatch.setattr(_EagerReplay, "replays", [])
    prompts, max_tokens = varied_prompts(7, seed=3)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
    kwargs = dict(max_running_req=4, page_size=4, max_extend_tokens=24, device="cpu")
    ref = LLM(model_dirs["qwen3"], attention="torch", **kwargs).generate(prompts, params)
    fi_llm = LLM(model_dirs["qwen3"], attention="flashinfer", **kwargs)
    runner = fi_llm.engine.graphs.prefill
    assert runner is not None and (runner.tokens, runner.max_reqs, runner.sizes) == (24, 4, [1, 3, 6, 12, 24])
    eager: list[int] = []  # the requests of each prefill planned eagerly
    backend = fi_llm.engine.attn_backend
    real_begin = backend.begin_forward

    def begin_forward(batch, graph=False) -> None:
        if batch.is_prefill and not graph:
            eager.append(batch.size)
        real_begin(batch, graph)

    monkeypatch.setattr(backend, "begin_forward", begin_forward)
    got = fi_llm.generate(prompts, params)
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in ref]
    replays = _EagerReplay.replays
    assert not eager, "every chunk replays a graph"
    assert min(reqs for reqs, _ in replays) < 4 and max(tokens for _, tokens in replays) == 24, replays
    assert any(tokens not in runner.sizes for _, tokens in replays), "a chunk shorter than its graph"


class _EagerDecodeGraph:
    """A decode 'graph' that replays by running the pass on the runner's fixed buffers, with the metadata the
    backend planned for the graph (the CPU captures nothing): what padding, the input buffers, the greedy twin
    and the engine's fast step give, without CUDA."""

    def __init__(self, runner, bs: int, greedy: bool, pick) -> None:
        self.runner, self.bs, self.greedy, self.pick = runner, bs, greedy, pick
        self.replays: list[int] = []  # the requests of each batch replayed

    def replay(self) -> None:
        from core.attention.context import forward_context, get_context

        runner, context = self.runner, get_context()
        static = runner._static_batch(self.bs, context.batch.reqs)
        static.attn_metadata = context.batch.attn_metadata
        with forward_context(static, context.backend, greedy_logits=self.greedy):
            logits = runner.model(static.input_ids, static.positions, None)
        runner.logits[self.bs, self.greedy].copy_(logits)
        if self.greedy:
            runner.tokens[self.bs].copy_(self.pick(logits))
        self.replays.append(context.batch.size)


def _capture_decode_eagerly(runner, device, greedy_pick) -> None:
    """Stands in for ``CudaGraphRunner._capture_all``: each size's (and greedy twin's) outputs and 'graph'."""
    from core.attention.context import forward_context

    for bs in runner.sizes:
        for greedy in (False, True) if bs in runner.greedy_sizes else (False,):
            batch = runner._static_batch(bs, [])
            runner._pad(0, bs)
            runner.backend.begin_forward(batch, graph=True)
            with forward_context(batch, runner.backend, greedy_logits=greedy):
                logits = runner.model(batch.input_ids, batch.positions, None)
            runner.logits[bs, greedy] = logits.clone()
            if greedy:
                runner.tokens[bs] = greedy_pick(logits).clone()
            runner.graphs[bs, greedy] = _EagerDecodeGraph(runner, bs, greedy, greedy_pick)


def test_decode_batches_through_the_decode_graphs_keep_the_tokens(model_dirs, fake_flashinfer, monkeypatch):
    """Decode batches of up to 4 rows run the decode graphs (here replayed eagerly) as the engine's fast step: padded
    to a captured size, their tokens gathered into the graph's buffer, a greedy batch-1 step on the greedy twin,
    which picks its token itself (the head's screen stood in for by a plain head), a sampled one on the plain graph;
    larger batches eagerly. The tokens stay the torch backend's, and after release_cuda_graphs too."""
    import core.engine.plan as plan_module
    import core.kernels.cuda.install as install_module
    from core.kernels.cuda.graphs.decode import CudaGraphRunner

    monkeypatch.setenv("MINISGL_DISABLE_CPU_DECODE", "1")  # every batch-1 step through the graphs
    monkeypatch.setenv("MINISGL_DISABLE_PREFILL_GRAPH", "1")  # prefills eager: the decode graphs alone
    monkeypatch.setattr(plan_module, "graph_max_bs", lambda config, device, attention: 4 * (attention == "flashinfer"))
    monkeypatch.setattr(install_module, "screen_head", lambda model, kernels, one_rank: True)
    monkeypatch.setattr(CudaGraphRunner, "_capture_all", _capture_decode_eagerly)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    prompts, _ = varied_prompts(6, seed=5)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 6, 9, 12, 4, 7)]
    kwargs = dict(max_running_req=6, page_size=4, device="cpu")
    ref = LLM(model_dirs["qwen3"], attention="torch", **kwargs).generate(prompts, params)
    fi_llm = LLM(model_dirs["qwen3"], attention="flashinfer", **kwargs)
    engine = fi_llm.engine
    runner = engine.graphs.decode
    assert engine.fast_steps == (engine.graphs,) and runner.sizes == [1, 2, 4] and runner.greedy_sizes == (1,)
    got = fi_llm.generate(prompts, params)
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in ref]
    assert 3 in runner.graphs[4, False].replays and runner.graphs[1, True].replays, "3 rows padded to 4; greedy 1"
    assert not runner.graphs[1, False].replays
    fi_llm.generate(prompts[:1], SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.7, seed=1))
    assert runner.graphs[1, False].replays == [1, 1]  # sampled: the plain graph (the prefill's token is sampled)
    engine.release_cuda_graphs()
    assert engine.graphs is None and engine.fast_steps == ()
    again = fi_llm.generate(prompts, params)
    assert [r["token_ids"] for r in again] == [r["token_ids"] for r in ref]
