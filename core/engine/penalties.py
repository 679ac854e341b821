"""The logits controls a request may set, applied to a batch's logits before the sampler picks its tokens:
repetition, frequency and presence penalties, logit bias, and min_tokens' hold-back of EOS and stop ids.

Only a batch in which some request sets one pays for them: ``prepare`` answers None for any other, and the sampler
then runs as if this module did not exist. The penalties read the tokens so far, which live on the device: the
host may not have the newest one yet (overlap scheduling prepares step N+1 before it has step N's tokens). So each
penalized request gets a slot in two device tables, its generated-token counts and the set of tokens it has seen
(prompt and generated), filled from its host ids at its first sampled step and then updated on the device with
every token it samples, in stream order. A slot is taken back once its request is done; the tables grow (doubling)
only as more penalized requests run at once.

Order, per row: repetition (transformers' ``RepetitionPenaltyLogitsProcessor``, on float32 logits: a positive
logit divided by the penalty, a negative one multiplied), frequency and presence (OpenAI's: minus the penalty
times the count, and minus the penalty once for a token that occurred), logit bias (added), then min_tokens (EOS
and stop ids to -inf). The raw logits are left as they were: log-probabilities stay the model's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.request import Req
from core.transfer import upload_list


@dataclass
class PenaltySlots:
    """The device tables of the penalized requests, one row (slot) each: counts of generated tokens and the set of
    tokens seen. Slots are handed out on the host as batches are prepared; the tables are touched only on the
    forward's stream, so a slot freed by a request that is done and reused is written after the steps before."""

    device: torch.device
    counts: torch.Tensor | None = None  # [slots, vocab] int32
    seen: torch.Tensor | None = None  # [slots, vocab] bool

    def __post_init__(self) -> None:
        self.owners: dict[Req, int] = {}
        self.free: list[int] = []
        self.taken = 0  # slots ever handed out: the tables need this many rows

    def slot(self, req: Req) -> tuple[int, bool]:
        """The request's slot, and whether it is new (to be filled from the request's ids)."""
        if req in self.owners:
            return self.owners[req], False
        if not self.free:
            for done in [r for r in self.owners if r.done]:
                self.free.append(self.owners.pop(done))
        if self.free:
            slot = self.free.pop()
        else:
            slot, self.taken = self.taken, self.taken + 1
        self.owners[req] = slot
        return slot, True

    def ensure(self, vocab: int) -> None:
        """Tables with a row for every slot handed out (grown by doubling, the rows so far kept)."""
        rows = 0 if self.counts is None else len(self.counts)
        if rows >= self.taken:
            return
        size = max(self.taken, 2 * rows)
        counts = torch.zeros(size, vocab, dtype=torch.int32, device=self.device)
        seen = torch.zeros(size, vocab, dtype=torch.bool, device=self.device)
        if rows:
            counts[:rows], seen[:rows] = self.counts, self.seen
        self.counts, self.seen = counts, seen


@dataclass
class BatchPenalties:
    """One batch's controls on the device. ``rows`` index the batch's penalized rows that sample this step and
    ``slots`` their slots; ``fresh`` the slots first used now, filled from (``fill_slots``, ``fill_ids``) for every
    token seen and (``count_slots``, ``count_ids``) for every token generated (a request that re-enters with
    generated tokens); ``bias_*`` and ``banned_*`` are (row, token) pairs."""

    table: PenaltySlots
    rows: torch.Tensor
    slots: torch.Tensor
    repetition: torch.Tensor | None  # [rows] float32; None when no row has one
    frequency: torch.Tensor | None
    presence: torch.Tensor | None
    fresh: torch.Tensor
    fill_slots: torch.Tensor
    fill_ids: torch.Tensor
    count_slots: torch.Tensor
    count_ids: torch.Tensor
    bias_rows: torch.Tensor
    bias_ids: torch.Tensor
    bias_values: torch.Tensor
    banned_rows: torch.Tensor
    banned_ids: torch.Tensor

    def sample(self, logits: torch.Tensor, pick: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The tokens ``pick`` chooses from the controlled logits; the penalized rows' counts move on with them."""
        controlled = self.apply(logits)
        tokens = pick(controlled)
        if len(self.rows):
            picked = tokens[self.rows]
            self.table.counts.index_put_((self.slots, picked), torch.ones_like(picked, dtype=torch.int32),
                                         accumulate=True)
            self.table.seen[self.slots, picked] = True
        return tokens

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """A float32 copy of ``logits`` with every control applied (the logits themselves are left as they are)."""
        out = logits.to(torch.float32, copy=True)
        if len(self.rows):
            self._fill_fresh(out.shape[-1])
            out[self.rows] = self._penalized(out[self.rows])
        if len(self.bias_rows):
            out.index_put_((self.bias_rows, self.bias_ids), self.bias_values, accumulate=True)
        if len(self.banned_rows):
            out[self.banned_rows, self.banned_ids] = float("-inf")
        return out

    def _fill_fresh(self, vocab: int) -> None:
        table = self.table
        table.ensure(vocab)
        if len(self.fresh):
            table.counts[self.fresh] = 0
            table.seen[self.fresh] = False
            table.seen[self.fill_slots, self.fill_ids] = True
            table.counts.index_put_((self.count_slots, self.count_ids),
                                    torch.ones_like(self.count_ids, dtype=torch.int32), accumulate=True)

    def _penalized(self, logits: torch.Tensor) -> torch.Tensor:
        if self.repetition is not None:
            penalty = self.repetition[:, None]
            scaled = torch.where(logits < 0, logits * penalty, logits / penalty)
            logits = torch.where(self.table.seen[self.slots], scaled, logits)
        if self.frequency is not None:
            counts = self.table.counts[self.slots]
            logits = logits - self.frequency[:, None] * counts - self.presence[:, None] * (counts > 0)
        return logits


class Penalties:
    """The sampler's controls: ``prepare`` builds a batch's (None when no request of it sets one)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.table = PenaltySlots(device)

    def prepare(self, reqs: list[Req], eos_token_ids: frozenset[int]) -> BatchPenalties | None:
        """Decided on the host from the requests' settings: only the rows that sample this step (not a chunk of a
        prompt that goes on) are controlled."""
        rows = [i for i, r in enumerate(reqs) if r.params.controls_logits and not r.is_chunked]
        if not rows:
            return None
        ints: dict[str, list[int]] = {name: [] for name in (
            "rows", "slots", "fresh", "fill_slots", "fill_ids", "count_slots", "count_ids", "bias_rows", "bias_ids",
            "banned_rows", "banned_ids")}
        floats: dict[str, list[float]] = {"repetition": [], "frequency": [], "presence": [], "bias_values": []}
        for i in rows:
            req, p = reqs[i], reqs[i].params
            if p.penalized:
                self._penalize(i, req, ints, floats)
            for token, value in p.logit_bias:
                ints["bias_rows"].append(i)
                ints["bias_ids"].append(token)
                floats["bias_values"].append(value)
            if req.device_len - req.prompt_len < p.min_tokens:  # tokens generated so far (the device's count)
                held = sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids)))
                ints["banned_rows"] += [i] * len(held)
                ints["banned_ids"] += held
        some_repetition = any(r != 1 for r in floats["repetition"])
        some_frequency = any(floats["frequency"]) or any(floats["presence"])
        on_device = {**_upload(ints, torch.int64, self.device), **_upload(floats, torch.float32, self.device)}
        if not some_repetition:
            on_device["repetition"] = None
        if not some_frequency:
            on_device["frequency"] = on_device["presence"] = None
        return BatchPenalties(self.table, **on_device)

    def _penalize(self, row: int, req: Req, ints: dict[str, list[int]], floats: dict[str, list[float]]) -> None:
        """A penalized row: its slot, its penalties, and for a new slot the ids to fill it with (the host has
        every one of them: a request is first sampled when its prompt, fed from the host, ends)."""
        slot, new = self.table.slot(req)
        ints["rows"].append(row)
        ints["slots"].append(slot)
        p = req.params
        floats["repetition"].append(p.repetition_penalty)
        floats["frequency"].append(p.frequency_penalty)
        floats["presence"].append(p.presence_penalty)
        if new:
            ints["fresh"].append(slot)
            seen = req.input_ids[:req.device_len]
            ints["fill_slots"] += [slot] * len(seen)
            ints["fill_ids"] += seen
            generated = req.input_ids[req.prompt_len:req.device_len]
            ints["count_slots"] += [slot] * len(generated)
            ints["count_ids"] += generated


def _upload(named: dict[str, list], dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Every list on the device in one copy, as views by name."""
    flat = upload_list([x for values in named.values() for x in values], dtype, device)
    return dict(zip(named, torch.split(flat, [len(values) for values in named.values()])))
