"""The C decode step (core/kernels/cpu/decode.c) gives the torch layers' logits, and writes the KV they write.

Every single-request decode step of a run is checked: the C step runs first, then the torch model on the same
batch, and their logits and the KV written for the new token must agree to float32 rounding. The runs use
4-token pages and a second request that finishes early, so the long request's context spans many pages that
are not contiguous in the pool (pages are handed out in turn while both decode). Under ``--precision int8`` the
C step reads int8 copies of the weights and of the LM head, and quantises each product's input to int8 (by blocks
of 32) for integer dot products; the torch side is made to compute the same (its linears quantised the same way
and every int8 product replaced by that product in torch), so the two agree as closely, but for a step where an
input value rounds to the other int8 level on one side. Skipped, with the reason, where the step cannot
be built.
"""

from __future__ import annotations

import ctypes
import statistics
from dataclasses import dataclass, field, replace

import pytest
import torch

from core import LLM
from core.attention.context import get_context
from core.engine import plan
from core.kernels import c_build
from core.kernels.cpu import decode as cpu_decode, int8_weights
from core.kernels.cpu import precision as cpu_precision
from core.kernels.cpu.decode import QBLOCK
from core.kernels.cpu.features import cpu_features
from core.kernels.dispatch import install_kernels, kernels_for
from core.kernels.cpu.int8_weights import Int8Weight, int8_linear, quantize_linears
from core.models import random_spec
from core.request import SamplingParams
from tests.support.models import FAMILIES

REASON = cpu_decode.unsupported_reason(cpu_features().flags) or cpu_decode.load_library().reason
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON or "the C decode step builds here")
PAGE = 4


@dataclass
class Checked:
    """Wraps the engine's C step; compares each call against the torch model on the same batch."""

    step: cpu_decode.CpuDecodeStep
    engine: object
    logit_errors: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    slot_gaps: bool = False
    # integer dot products: an input value within float32 rounding of half-way between two int8 levels rounds
    # apart on the two sides (their float32 sums run in other orders), one level of one block; such a step is
    # counted, and held to 2% of the logits' (and the K and V values') size instead
    quantised_inputs: bool = False
    rounded_apart: int = 0

    def __call__(self, token: torch.Tensor, position: torch.Tensor, slots: torch.Tensor,
                 screen: bool = False) -> torch.Tensor:
        engine, context = self.engine, get_context()
        batch = context.batch
        context.greedy_logits = False  # every logit is compared: the step and the torch model run unscreened
        assert int(slots[-1]) == int(batch.out_loc[0]) and int(position[0]) == slots.shape[0] - 1
        ours = self.step(token, position, slots).clone()
        pool, slot = engine.kv_pool, int(slots[-1])
        k_ours, v_ours = pool.k[:, slot].clone(), pool.v[:, slot].clone()
        engine.attn_backend.begin_forward(batch)
        theirs = engine.model(batch.input_ids, batch.positions, torch.zeros(1, dtype=torch.int64))
        # logits here are about 10 in size; float32's other summation order, amplified by the test models'
        # large random weights, reaches 2.5e-4 at an odd step and stays near 1e-5 at the typical one
        pairs = ((ours, theirs, 5e-4), (k_ours, pool.k[:, slot], 1e-4), (v_ours, pool.v[:, slot], 1e-4))
        close = all(torch.allclose(a, b, rtol=1e-4, atol=atol) for a, b, atol in pairs)
        if self.quantised_inputs and not close:
            self.rounded_apart += 1
            for a, b, _ in pairs:
                assert float((a - b).abs().max()) <= 0.02 * float(b.abs().max())
        else:
            for a, b, atol in pairs:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=atol)
        self.logit_errors.append(float((ours - theirs).abs().max()))
        self.lengths.append(slots.shape[0])
        self.slot_gaps |= bool((slots.diff() != 1).any())
        return theirs  # the run continues on torch's logits, so both sides see the same tokens


def quantise_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., n] as the C step quantises a product's input: blocks of QBLOCK values, each to int8 with the scale
    max|x| / 127 of its block (rounded to nearest); returns the values [..., n] and the scales [..., blocks]."""
    n = x.shape[-1]
    blocks = -(-n // QBLOCK)
    padded = torch.nn.functional.pad(x, (0, blocks * QBLOCK - n)).unflatten(-1, (blocks, QBLOCK))
    top = padded.abs().amax(dim=-1, keepdim=True)
    q = torch.round(padded * torch.where(top > 0, 127 / top, 0.0))
    return q.flatten(-2)[..., :n], (top / 127).squeeze(-1)


def quantised_input_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What the C step's integer dot products compute, in torch (float64): x quantised by blocks, each block's
    product with the int8 weight times the block's scale, the sum times the row's scale."""
    q, scales = quantise_blocks(x)
    n, blocks = x.shape[-1], scales.shape[-1]
    w = torch.nn.functional.pad(weight.values.double(), (0, blocks * QBLOCK - n)).unflatten(-1, (blocks, QBLOCK))
    q = torch.nn.functional.pad(q.double(), (0, blocks * QBLOCK - n)).unflatten(-1, (blocks, QBLOCK))
    per_block = torch.einsum("...bk,obk->...ob", q, w)  # exact integer sums
    out = ((per_block * scales.double()[..., None, :]).sum(-1) * weight.scales.double()).float()
    return out if bias is None else out + bias


def run_checked(model: str, prompts: list[list[int]], max_tokens: list[int], precision: str = "exact",
                monkeypatch: pytest.MonkeyPatch | None = None) -> Checked:
    if precision == "int8":  # the torch side's int8 products computing what the C step's integer dot products do
        monkeypatch.setattr(int8_weights, "int8_linear", quantised_input_linear)
    with LLM(model, device="cpu", precision=precision, page_size=PAGE, max_running_req=4) as llm:
        engine = llm.engine
        assert engine.cpu_paths.decode_step is not None and "decode steps in C" in engine.describe()
        assert engine.cpu_paths.int8_linears == 0  # the torch layers keep float32: the C step reads int8 copies
        step = engine.cpu_paths.decode_step
        if precision == "int8":  # the torch side quantised as the C step's copies were, LM head too
            assert isinstance(step.lm_head, Int8Weight)
            quantize_linears(engine.model)
            install_kernels(engine.model, kernels_for(replace(engine.plan.kernels, int8_weights=True)))
            engine.model.lm_head.forward = lambda hidden: quantised_input_linear(hidden, step.lm_head)
        checked = Checked(step, engine, quantised_inputs=engine.plan.precision.int8_dots)
        engine.cpu_paths.fast_step.step = checked
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
        llm.generate(prompts, params)
    return checked


@pytest.mark.parametrize("family", [*FAMILIES, "llama3-rope-tied"])  # GQA (4 heads, 2 KV heads); bias; QK-norm
def test_the_c_step_matches_the_torch_layers_across_scattered_pages(model_dirs, family):
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (9, 5)]
    checked = run_checked(model_dirs[family], prompts, [24, 4])
    assert len(checked.lengths) >= 20 and max(checked.lengths) >= 8 * PAGE  # many pages of context
    assert checked.slot_gaps  # the long request's pages are not one run of slots
    assert statistics.median(checked.logit_errors) < 3e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_the_int8_c_step_matches_the_torch_int8_layers(model_dirs, family, monkeypatch):
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (9, 5)]
    checked = run_checked(model_dirs[family], prompts, [24, 4], precision="int8", monkeypatch=monkeypatch)
    assert len(checked.lengths) >= 20 and checked.slot_gaps
    assert statistics.median(checked.logit_errors) < 3e-5 and checked.rounded_apart <= len(checked.lengths) // 4


def test_the_int8_c_step_on_a_random_shape_with_head_dim_128(monkeypatch):
    checked = run_checked("random:small-qwen3", [list(range(1, 40))], [13], precision="int8", monkeypatch=monkeypatch)
    assert len(checked.lengths) == 12 and checked.rounded_apart <= len(checked.lengths) // 4


def test_the_int8_c_step_on_shapes_that_leave_rows_and_values_outside_the_tiles(monkeypatch):
    # every width a multiple of neither the tile's 8 rows nor the 32-value blocks: the tiles' tails, rows left
    # over after the tiles (vocab 301, hidden 72), and gate/up rows whose tiles do not line up (intermediate 100)
    tiny = random_spec.SPECS["tiny-qwen3"]
    odd = replace(tiny.config, vocab_size=301, hidden_size=72, intermediate_size=100)
    monkeypatch.setitem(random_spec.SPECS, "odd-qwen3", replace(tiny, name="odd-qwen3", config=odd))
    checked = run_checked("random:odd-qwen3", [list(range(1, 30))], [12], precision="int8", monkeypatch=monkeypatch)
    assert len(checked.lengths) == 11 and checked.rounded_apart <= 2


@pytest.mark.parametrize("rows, cols", [(1536, 576), (576, 1536), (7, 13), (45, 64)])  # blocks of 4 and leftovers
def test_the_int8_gemv_is_the_dequantised_product(rows, cols):
    gen = torch.Generator().manual_seed(rows)
    weight = Int8Weight.quantize(torch.randn(rows, cols, generator=gen))
    x, y = torch.randn(cols, generator=gen), torch.empty(rows)
    cpu_decode.load_library().library.gemv_int8(weight.values.data_ptr(), weight.scales.data_ptr(), x.data_ptr(),
                                                rows, cols, y.data_ptr(), 2)
    exact = (weight.values.double() @ x.double()) * weight.scales.double()
    # the outputs are about sqrt(cols) in size: float32 sums over them are good to about 1e-5 of that
    torch.testing.assert_close(y.double(), exact, rtol=0, atol=1e-6 * cols ** 0.5 * 4)
    torch.testing.assert_close(y, int8_linear(x[None], weight)[0], rtol=0, atol=2e-4)


# tiles of 8 rows with and without tails and rows left over
@pytest.mark.parametrize("rows, cols", [(1536, 576), (576, 1536), (7, 13), (45, 64), (9, 100), (24, 72)])
def test_the_integer_dot_products_are_the_product_of_the_quantised_operands(rows, cols):
    gen = torch.Generator().manual_seed(rows)
    weight = Int8Weight.quantize(torch.randn(rows, cols, generator=gen))
    x = torch.randn(cols, generator=gen) * torch.rand(cols, generator=gen) * 3  # blocks of varied range
    y, q = torch.empty(rows), torch.empty(cols, dtype=torch.int8)
    scales = torch.empty(-(-cols // cpu_decode.QBLOCK))
    cpu_decode.load_library().library.gemv_int8_dots(
        weight.values.data_ptr(), weight.scales.data_ptr(), x.data_ptr(), rows, cols, y.data_ptr(), 2, q.data_ptr(),
        scales.data_ptr())
    # the input: each block symmetric with its max|x| at 127, every value within half its block's scale of x
    theirs_q, theirs_scales = quantise_blocks(x)
    torch.testing.assert_close(scales, theirs_scales, rtol=1e-6, atol=0)
    assert int((q.float() - theirs_q).abs().max()) <= 1  # x * (127 / max) against torch's: a tie may round apart
    per_value = scales.repeat_interleave(cpu_decode.QBLOCK)[:cols]
    assert bool(((q.float() * per_value - x).abs() <= per_value / 2 * (1 + 1e-5)).all())
    # each block's int32 sums are exact: only the float32 roundings (6e-8 each) of the scaling and of the sums
    # over blocks and lanes are left, at most (blocks + 8) of them on any partial sum, each partial sum bounded
    # by the sum of the products' magnitudes
    blocks = [slice(k, k + cpu_decode.QBLOCK) for k in range(0, cols, cpu_decode.QBLOCK)]
    w, qd = weight.values.double(), q.double()
    exact = sum((w[:, b] @ qd[b]) * float(scales[i]) for i, b in enumerate(blocks)) * weight.scales.double()
    size = sum((w[:, b].abs() @ qd[b].abs()) * float(scales[i]) for i, b in enumerate(blocks)) * weight.scales
    assert bool(((y.double() - exact).abs() <= (len(blocks) + 8) * 6e-8 * size).all())


def test_an_int8_lm_head_is_within_half_a_scale_per_weight_of_the_float64_logits():
    gen = torch.Generator().manual_seed(5)
    head = torch.randn(4099, 576, generator=gen) * torch.rand(4099, 1, generator=gen)  # rows of varied range
    hidden, logits = torch.randn(576, generator=gen), torch.empty(4099)
    q = Int8Weight.quantize(head)
    cpu_decode.load_library().library.gemv_int8(q.values.data_ptr(), q.scales.data_ptr(), hidden.data_ptr(),
                                                4099, 576, logits.data_ptr(), 2)
    exact = head.double() @ hidden.double()
    # each weight is within half its row's scale, so each logit within sum|h| * scale / 2 (float32 sums aside) ...
    bound = hidden.double().abs().sum() * q.scales.double() / 2
    assert bool(((logits.double() - exact).abs() <= bound + 1e-4).all())
    # ... and rounding errors of both signs cancel: the typical one is far inside that bound
    assert float((logits.double() - exact).abs().median() / bound.median()) < 0.05


def test_a_random_shape_with_head_dim_128_matches_too():
    checked = run_checked("random:small-qwen3", [list(range(1, 40))], [6])
    assert len(checked.lengths) == 5


@pytest.fixture
def cpu_without_amx(monkeypatch):
    """This CPU's features less AMX: where the C step cannot run, an AMX CPU's fast takes bf16 instead of
    saying why it keeps float32."""
    no_amx = replace(cpu_features(), flags=cpu_features().flags - {"amx_bf16"})
    monkeypatch.setattr(plan, "cpu_features", lambda: no_amx)
    monkeypatch.setattr(cpu_precision, "cpu_features", lambda: no_amx)


def test_no_compiler_keeps_torch_and_says_so(monkeypatch, cpu_without_amx):
    monkeypatch.setattr(c_build, "find_compiler", lambda: None)
    cpu_decode.load_library.cache_clear()
    try:
        with LLM("random:tiny-qwen3", device="cpu", precision="fast") as llm:
            assert llm.engine.cpu_paths.decode_step is None
            assert "no C compiler found" in llm.precision_note and "\n" not in llm.precision_note
            assert llm.precision_note.startswith("precision fast: kept exact float32")
        with LLM("random:tiny-qwen3", device="cpu") as llm:
            assert llm.engine.cpu_paths.decode_step is None and "decode steps in C" not in llm.engine.describe()
    finally:
        cpu_decode.load_library.cache_clear()


def test_a_failed_build_is_one_line_and_leaves_no_object(tmp_path):
    source = tmp_path / "broken.c"
    source.write_text("int f(void) { return undeclared; }\n")
    built = c_build.build_library(source, ("-O2",), tmp_path / "cache")
    assert built.library is None and "could not build broken.c" in built.reason and "\n" not in built.reason
    assert not list((tmp_path / "cache").glob("*.so"))


def test_an_edited_header_builds_afresh(tmp_path):
    """A header the source includes from its folder is part of the object's key: editing it builds a new object
    that returns the header's new value, never the stale one."""
    (tmp_path / "value.h").write_text("#define VALUE 1\n")
    source = tmp_path / "uses_header.c"
    source.write_text('#include "value.h"\nint value(void) { return VALUE; }\n')
    signatures = {"value": ([], ctypes.c_int)}
    first = c_build.build_library(source, ("-O2",), tmp_path / "cache", signatures)
    assert first.library is not None and first.library.value() == 1
    (tmp_path / "value.h").write_text("#define VALUE 2\n")
    second = c_build.build_library(source, ("-O2",), tmp_path / "cache", signatures)
    assert second.library is not None and second.library.value() == 2
    assert len(list((tmp_path / "cache").glob("uses_header-*.so"))) == 2


def test_the_off_switch_keeps_the_torch_path(monkeypatch, cpu_without_amx):
    with LLM("random:tiny-qwen3", device="cpu") as llm:
        assert llm.engine.cpu_paths.decode_step is not None
        assert "single-request decode steps in C" in llm.engine.describe()
    monkeypatch.setenv("MINISGL_DISABLE_CPU_DECODE", "1")
    with LLM("random:tiny-qwen3", device="cpu", precision="fast") as llm:
        assert llm.engine.cpu_paths.decode_step is None and "MINISGL_DISABLE_CPU_DECODE" in llm.precision_note
    with LLM("random:tiny-qwen3", device="cpu") as llm:
        assert llm.engine.cpu_paths.decode_step is None


class Screening:
    """Wraps the engine's C step: each greedy step runs unscreened and then screened on the same inputs (the second
    run writes the same K and V again), and the two are compared."""

    def __init__(self, step: cpu_decode.CpuDecodeStep) -> None:
        self.step, self.steps, self.candidates = step, 0, []

    def __call__(self, token: torch.Tensor, position: torch.Tensor, slots: torch.Tensor,
                 screen: bool = False) -> torch.Tensor:
        full = self.step(token, position, slots)
        if not screen:
            return full
        screened = self.step(token, position, slots, screen=True)
        kept = torch.isfinite(screened)
        assert torch.equal(screened[kept], full[kept])  # the rows computed in float32 are the full product's
        assert int(screened.argmax()) == int(full.argmax())
        assert bool(kept[0, int(full.argmax())])
        self.steps += 1
        self.candidates.append(int(kept.sum()))
        return screened


@pytest.mark.parametrize("model", ["smollm2", "random:small-qwen3", "llama3-rope-tied", "random:odd-qwen3"])
def test_a_screened_greedy_step_keeps_the_full_products_largest_logit(model, model_dirs, smollm2_dir, monkeypatch):
    """The embedded model; head dim 128; tied embeddings; widths off the tiles and blocks (vocab 301, hidden 72)."""
    tiny = random_spec.SPECS["tiny-qwen3"]
    odd = replace(tiny.config, vocab_size=301, hidden_size=72, intermediate_size=100)
    monkeypatch.setitem(random_spec.SPECS, "odd-qwen3", replace(tiny, name="odd-qwen3", config=odd))
    path = smollm2_dir if model == "smollm2" else model if model.startswith("random:") else model_dirs[model]
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (7, 30)]
    with LLM(path, device="cpu", page_size=PAGE, max_running_req=1) as llm:  # one request at a time: every step is the C step
        screening = llm.engine.cpu_paths.fast_step.step = Screening(llm.engine.cpu_paths.decode_step)
        greedy = llm.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
        assert screening.steps == 2 * 11
        if model == "smollm2":  # on a trained model's peaked logits the screen leaves almost every row out
            assert max(screening.candidates) < llm.engine.model_config.vocab_size // 100, screening.candidates
        # log-probabilities and sampled steps see every logit: no screen
        asked = llm.generate(prompts[:1], SamplingParams(max_tokens=4, ignore_eos=True, logprobs=2))
        sampled = llm.generate(prompts[:1], SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.8, seed=1))
        assert screening.steps == 2 * 11
    assert asked[0]["token_ids"] == greedy[0]["token_ids"][:4] and len(sampled[0]["token_ids"]) == 4
