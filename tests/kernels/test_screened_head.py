"""The greedy LM head's screen (core/kernels/cpu/screened_head.py): every logit it keeps is bit-equal to the C GEMM's,
each row's largest logit and the first index holding it are always kept, and what it drops is -inf; the engine's
greedy tokens are the same with and without it."""

from __future__ import annotations

import pytest
import torch

from core import LLM, SamplingParams
from core.engine.plan import kernel_choices
from core.kernels.cpu import gemm as cpu_gemm, screened_head
from core.kernels.cpu.features import cpu_features
from core.kernels.cpu.gemm import PanelWeight
from core.kernels.cpu.screened_head import ScreenedHead

FLAGS = cpu_features().flags
REASON = (cpu_gemm.unsupported_reason(FLAGS) or cpu_gemm.load_library().reason
          or screened_head.unsupported_reason(FLAGS))
pytestmark = pytest.mark.skipif(bool(REASON), reason=REASON or "the screen runs here")


def check_screen(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The screen's logits against the full product's; returns the kept mask."""
    panels = PanelWeight.of(weight, threads=2)
    full = panels.linear(x)
    screened = ScreenedHead.of(weight, panels).logits(x)
    assert screened.shape == full.shape
    kept = torch.isfinite(screened)
    assert torch.equal(screened[kept], full[kept]), "a kept logit is not the full product's"
    assert bool((screened[~kept] == float("-inf")).all())
    best = full.max(dim=-1)
    assert torch.equal(screened.max(dim=-1).values, best.values)
    assert torch.equal(screened.argmax(dim=-1), full.argmax(dim=-1)), "the first index of the maximum moved"
    # every logit equal to a row's maximum is kept
    assert bool((kept | (full < best.values[:, None])).all())
    return kept


# rows: one, part of a block of 8, a whole block, more; vocabularies off the groups of 16; inputs off blocks of 32
@pytest.mark.parametrize("rows, vocab, hidden", [(1, 1000, 64), (5, 777, 100), (8, 4099, 576), (13, 2000, 35)])
def test_kept_logits_are_the_full_products_and_the_maximum_is_kept(rows, vocab, hidden):
    gen = torch.Generator().manual_seed(rows * 100 + vocab)
    weight = torch.randn(vocab, hidden, generator=gen) * 0.05
    x = torch.randn(rows, hidden, generator=gen)
    x[:, 3] *= 30  # an outlier dimension, as final hidden states have
    kept = check_screen(weight, x)
    assert int(kept.sum(dim=-1).max()) < vocab  # it screens something


def test_peaked_rows_keep_few_logits():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(3000, 128, generator=gen) * 0.05
    x = weight[torch.tensor([5, 700, 2999])] * 40  # each row's own logit far ahead
    kept = check_screen(weight, x)
    assert kept.sum(dim=-1).tolist() == [1, 1, 1]


def test_tied_maxima_are_all_kept_and_the_first_wins():
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(500, 64, generator=gen) * 0.05
    weight[400] = weight[17]  # the same row twice: the same logit, bit for bit
    x = (weight[17] * 40).expand(4, -1).contiguous()
    kept = check_screen(weight, x)
    assert bool(kept[:, 17].all() and kept[:, 400].all())


def test_the_plan_screens_only_beside_the_c_gemm_with_vnni(monkeypatch):
    cpu = torch.device("cpu")
    assert kernel_choices("torch", cpu, torch.float32).screened_head
    assert not kernel_choices("torch", cpu, torch.float32, bf16_linears=True).screened_head
    monkeypatch.setenv("MINISGL_DISABLE_SCREENED_HEAD", "1")
    assert not kernel_choices("torch", cpu, torch.float32).screened_head
    assert screened_head.unsupported_reason(frozenset({"avx512f"})) == \
        "the screened LM head needs avx512bw, avx512_vnni"


def test_an_engines_greedy_tokens_are_the_same_without_the_screen(monkeypatch):
    prompts = [[1, 5, 9, 2], [7, 7, 3], [4, 10, 11, 12, 13], [2]]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    runs = []
    for disabled in ("0", "1"):
        monkeypatch.setenv("MINISGL_DISABLE_SCREENED_HEAD", disabled)
        with LLM("random:tiny-qwen3", device="cpu") as llm:
            assert llm.engine.screened_head == (disabled == "0")
            runs.append([out["token_ids"] for out in llm.generate(prompts, params)])
    assert runs[0] == runs[1]
