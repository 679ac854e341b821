"""Turning logits into next tokens, per request: greedy, temperature, top-k, top-p, min-p, seeded; a batch in
which some request sets a penalty, a logit bias or min_tokens has its logits controlled first (penalties.py).

Random choices use the exponential-race trick: ``argmax(p / E)`` with ``E ~ Exp(1)`` draws from ``p``. The
noise comes from a counter-based hash of (request seed, token position, vocabulary index) computed with
integer tensor ops, so a request's draw depends only on its own seed and position: the same seed gives the
same tokens alone or in any batch, on any device, with no per-request generator objects and no host sync.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from core.engine.penalties import BatchPenalties, Penalties
from core.kernels.sampling import COLUMN_MULTIPLIER, MASK31, SamplingKernels, mix, row_keys
from core.constrain.masks import TokenMasks, apply_masks
from core.request import Batch, Req
from core.transfer import upload_list


@dataclass
class SampleArgs:
    """Per-row sampling parameters on the device; ``None`` when every row is greedy (the fast path)."""

    temperatures: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None  # None when no row sets one
    seeds: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    greedy_rows: torch.Tensor | None = None
    # some row of a sampled batch may be greedy; ``prepare`` says False when none is, and the argmax pass is skipped
    any_greedy: bool = True
    filtered: bool = False  # some row has top-k, top-p or min-p off its "keep everything" value
    # the most logprob alternatives any row asked for; -1 when none asked (the fast path: nothing computed)
    logprobs: int = -1
    penalties: BatchPenalties | None = None  # None when no row sets a logits control (the usual step)
    masks: TokenMasks | None = None  # rows under a grammar: the tokens each may take next (core/constrain/)

    @property
    def all_greedy(self) -> bool:
        return self.temperatures is None

    @property
    def only_largest_logit(self) -> bool:
        """Every row greedy on its raw logits, no log-probabilities: only each row's largest logit must be exact
        (a screened LM head, a greedy graph that picks the tokens itself)."""
        return self.all_greedy and self.logprobs < 0 and self.penalties is None


MIN_TEMPERATURE = 1e-5  # a greedy row's temperature in the race (its token is the argmax's anyway)
TOP_K_CAP = 2 ** 31  # larger than any vocabulary
LARGEST_UNIFORM = 1.0 - 2.0 ** -24  # the race's noise stays below 1 (hashed_uniform)


def sample_row(req: Req) -> tuple[float, float, int, int, int, bool, int, bool, float]:
    """(temperature, top_p, top_k, greedy, seed, filtered, logprobs, controlled, min_p) of a request, kept on it. ``prepare`` reads
    them for every row of every step; made once, a step's cost at 256 rows is one transpose of these tuples, not
    a dozen passes over the requests' settings."""
    p = req.params
    # any top-k from the vocabulary's size up keeps every token: capped, it fits the int64 upload whatever it was
    row = (max(p.temperature, MIN_TEMPERATURE), p.top_p, min(p.top_k, TOP_K_CAP), int(p.greedy), req.sample_seed,
           p.top_k != -1 or p.top_p < 1.0 or p.min_p > 0, -1 if p.logprobs is None else p.logprobs,
           p.controls_logits, p.min_p)
    req.sample_row = row
    return row


def hashed_uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, vocab] uniforms in (0, 1), a pure function of (seed, position, column).

    The row key is mixed thoroughly once per row; each of the rows x vocab elements gets one mix of the key
    with its scrambled column (the per-element work is what costs). 24 bits per uniform, never 0 or 1: the
    largest, 1 - 2^-25, rounds to 1 in float32, so it is held at 1 - 2^-24 (at 1 its token's score would be
    infinite, and win whatever its logit, even a masked one's -inf)."""
    key = row_keys(seeds, positions)
    cols = (torch.arange(vocab, device=seeds.device, dtype=torch.int64) * COLUMN_MULTIPLIER) & MASK31
    bits = mix((key[:, None] ^ cols[None, :]) & MASK31) >> 7
    return ((bits.to(torch.float32) + 0.5) * (1.0 / (1 << 24))).clamp_max_(LARGEST_UNIFORM)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


def _first_max(logits: torch.Tensor) -> torch.Tensor:
    """``argmax``'s index (the first maximal one, as documented for both) through ``max``, which on a CPU runs
    the faster of the two reductions (docs/BENCHMARKS.md)."""
    return logits.max(dim=-1).indices


def _race(logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor,
          positions: torch.Tensor) -> torch.Tensor:
    """The race over the whole vocabulary (no top-k/top-p filter), in log space:
    ``log(softmax(l / T) / E) = l / T - log E - log Z``, and the constant ``log Z`` does not move the argmax."""
    noise = hashed_uniform(seeds, positions, logits.shape[-1])
    return (logits.float() / temperatures[:, None] - torch.log(-torch.log(noise))).argmax(dim=-1)


def _compiled_race() -> Callable:
    """On CUDA the race is several passes over [batch, vocab] (the hash alone is a handful of integer ops);
    compiled, it is one fused kernel. Falls back to eager if compilation is unavailable or fails."""
    compiled = torch.compile(_race, dynamic=True)
    state = {"fn": compiled}

    def run(*args: torch.Tensor) -> torch.Tensor:
        try:
            return state["fn"](*args)
        except Exception as exc:  # an inductor/triton problem must not stop generation
            if state["fn"] is _race:
                raise
            warnings.warn(f"compiled sampling failed ({type(exc).__name__}: {exc}); sampling eagerly")
            state["fn"] = _race
            return _race(*args)

    return run


class Sampler:
    def __init__(self, device: torch.device, compile: bool | None = None,
                 kernels: SamplingKernels | None = None) -> None:
        """``kernels``: a wing's race and greedy pick, handed over where the engine's plan chose them (the CUDA
        wing's Triton kernels), else the race compiled on CUDA (``compile``, by default there) or eager."""
        self.device = device
        if compile is None:
            compile = device.type == "cuda"
        self._race = kernels.race if kernels else _compiled_race() if compile else _race
        # greedy picks on the race's kernels too where they run (the same first maximal column)
        self._greedy = _first_max if device.type == "cpu" else kernels.greedy if kernels else _argmax
        self._warm_rows = kernels.warm_rows if kernels else (1, 2)
        # a wing's kernels that read a grammar's masks themselves: no masked copy of the logits first
        self._picks_read_masks = kernels is not None and kernels.reads_masks and self._greedy is kernels.greedy
        self.penalties = Penalties(device)

    def warm_up(self, vocab_size: int, dtype: torch.dtype) -> None:
        """Compile the race now rather than inside the first sampled step. Compiled code is shared by every
        batch of two rows or more, but a batch of one gets its own (sizes 0 and 1 are specialised): without
        this, the step where a run's batch first shrinks to one request would stall for the compilation. A wing's
        kernels may have more variants (the Triton race's for many rows), compiled here too. Logits under a
        penalty, a bias or min_tokens reach the race in float32 (penalties.py), a variant of their own: compiled
        here as well, or the first such request would stall every stream of its step."""
        for logits_dtype in dict.fromkeys((dtype, torch.float32)):
            for rows in self._warm_rows:
                logits = torch.zeros(rows, vocab_size, dtype=logits_dtype, device=self.device)
                ones = torch.ones(rows, dtype=torch.float32, device=self.device)
                ids = torch.zeros(rows, dtype=torch.int64, device=self.device)
                self._race(logits, ones, ids, ids.clone())
                if self._picks_read_masks and logits_dtype == dtype:  # their variants under a grammar's masks
                    bits = torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32, device=self.device)
                    self._race(logits, ones, ids, ids.clone(), bits=bits)
                    self._greedy(logits, bits=bits)

    def prepare(self, batch: Batch, eos_token_ids: frozenset[int] = frozenset()) -> SampleArgs:
        """``eos_token_ids``: what min_tokens holds back besides a request's stop ids."""
        reqs = batch.reqs
        if not reqs:
            return SampleArgs()
        temperatures, top_p, top_k, greedy, seeds, filtered, logprobs, controlled, min_p = zip(
            *[r.sample_row or sample_row(r) for r in reqs])
        penalties = self.penalties.prepare(reqs, eos_token_ids) if any(controlled) else None
        if all(greedy):
            return SampleArgs(logprobs=max(logprobs), penalties=penalties)

        # three uploads per step rather than one per field; what the compiled race reads starts each one (a view
        # at an offset could make the compiled code specialise on that offset)
        floats = upload_list([*temperatures, *top_p], torch.float32, self.device).view(2, -1)
        seeds = upload_list(list(seeds), torch.int64, self.device)
        ints = upload_list([r.device_len for r in reqs] + [*top_k, *greedy], torch.int64, self.device).view(3, -1)
        return SampleArgs(
            temperatures=floats[0], top_p=floats[1], seeds=seeds, positions=ints[0], top_k=ints[1],
            greedy_rows=ints[2].bool(), any_greedy=any(greedy), filtered=any(filtered), logprobs=max(logprobs),
            penalties=penalties,
            min_p=upload_list(list(min_p), torch.float32, self.device) if any(min_p) else None,
        )

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        """Each row's first maximal column: what ``sample`` gives an all-greedy batch (a decode graph may capture
        it, core/kernels/cuda/graphs/decode.py)."""
        return self._greedy(logits)

    def sample(self, logits: torch.Tensor, args: SampleArgs) -> torch.Tensor:
        masks = args.masks
        if masks is not None and not self._masks_read_by_picks(logits, args):
            # rows under a grammar: what it does not allow next gets -inf (core/constrain/)
            logits, masks = apply_masks(logits, masks), None
        if args.penalties is not None:  # some row sets a penalty, a logit bias or min_tokens (penalties.py)
            return args.penalties.sample(logits, lambda controlled: self._pick(controlled, args))
        return self._pick(logits, args, None if masks is None else masks.bits)

    def _masks_read_by_picks(self, logits: torch.Tensor, args: SampleArgs) -> bool:
        """Whether the race and the greedy pick apply the masks themselves: a wing's kernels that can, every row
        under a grammar, and nothing else that reads the logits first (penalties, top-k/top-p/min-p)."""
        return (self._picks_read_masks and args.penalties is None and not args.filtered
                and args.masks.bits.shape[0] == logits.shape[0])

    def _pick(self, logits: torch.Tensor, args: SampleArgs, bits: torch.Tensor | None = None) -> torch.Tensor:
        """``bits``: a grammar's masks, where the wing's picks apply them themselves (the torch ones never see any)."""
        masks = {} if bits is None else {"bits": bits}
        if args.all_greedy:
            return self._greedy(logits, **masks)
        if args.filtered:
            probs = torch.softmax(logits.float() / args.temperatures[:, None], dim=-1)
            probs = _top_k_top_p(probs, args.top_k, args.top_p, args.min_p)
            noise = hashed_uniform(args.seeds, args.positions, logits.shape[-1])
            sampled = (probs / -torch.log(noise)).argmax(dim=-1)
        else:
            sampled = self._race(logits, args.temperatures, args.seeds, args.positions, **masks)
        if not args.any_greedy:  # a pass over every logit saved (at 256 rows of a 152K vocabulary, 78 MB in bf16)
            return sampled
        return torch.where(args.greedy_rows, self._greedy(logits, **masks), sampled)


@dataclass
class TokenLogprobs:
    """Per row: the sampled token's log-probability and the ``k`` most likely tokens with theirs."""

    chosen: torch.Tensor  # [rows] float32
    top_ids: torch.Tensor  # [rows, k] int64
    top_values: torch.Tensor  # [rows, k] float32

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "TokenLogprobs":
        pinned = device == "cpu" and self.chosen.device.type == "cuda"

        def move(x: torch.Tensor) -> torch.Tensor:
            if not pinned:
                return x.to(device)
            host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            return host.copy_(x, non_blocking=non_blocking)

        return TokenLogprobs(move(self.chosen), move(self.top_ids), move(self.top_values))

    def row(self, i: int, k: int) -> tuple[float, tuple[tuple[int, float], ...]]:
        """Row ``i`` on the host: its token's logprob and its first ``k`` alternatives as (id, logprob)."""
        ids, values = self.top_ids[i, :k].tolist(), self.top_values[i, :k].tolist()
        return float(self.chosen[i]), tuple(zip(ids, values))


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int) -> TokenLogprobs:
    """Log-softmax of the raw logits in float32 (the model's own distribution, as OpenAI's API reports it):
    only computed for a batch in which some request asked, so the usual step never pays for it."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(-1, tokens.view(-1, 1).to(torch.int64)).view(-1)
    top_values, top_ids = logp.topk(k, dim=-1) if k > 0 else (logp[:, :0], tokens.new_zeros(len(tokens), 0))
    return TokenLogprobs(chosen, top_ids.to(torch.int64), top_values)


def _top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 min_p: torch.Tensor | None = None) -> torch.Tensor:
    """Zero the tokens outside each row's top-k and nucleus, and those less likely than its min-p times the most
    likely one (transformers' ``MinPLogitsWarper``); the most likely token always survives."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    vocab = probs.shape[-1]
    rank = torch.arange(vocab, device=probs.device)[None, :]
    k = torch.where(top_k < 0, torch.full_like(top_k, vocab), top_k)
    keep = rank < k[:, None]
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above each token
    keep &= before < top_p[:, None]
    if min_p is not None:
        keep &= sorted_probs >= min_p[:, None] * sorted_probs[:, :1]
    keep[:, 0] = True
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs * keep)
    return kept
