"""A launched step's sampled tokens, handed to their requests: judged from what was scheduled and from the tokens
the host has received, never from lengths a later launch already moved on (core/scheduler/loops.py)."""

from __future__ import annotations

from core.constrain.masks import advance
from core.engine.sampler import TokenLogprobs
from core.request import Req
from core.scheduler.reply import Reply
from core.scheduler.step import Prepared


Results = tuple[list[Reply], list[Req]]  # the replies to send, and the requests that just finished


def take_tokens(prepared: Prepared, tokens: list[int], logprobs: TokenLogprobs | None,
                eos_token_ids: frozenset[int]) -> Results:
    """Append each sampled token to its request; the replies to send, and the requests that just finished
    (marked done: a step already launched for them has its token dropped)."""
    replies: list[Reply] = []
    finished: list[Req] = []
    for row, (req, token, samples) in enumerate(zip(prepared.batch.reqs, tokens, prepared.samples)):
        if not samples or req.done:  # a prompt chunk, or a request already answered
            continue
        req.input_ids.append(token)
        req.output_ids.append(token)
        reason, complete = None, False
        if not req.params.ignore_eos and token in eos_token_ids or token in req.params.stop_token_ids:
            reason = "stop"
        elif req.matcher is not None and advance(req.matcher, token):  # its grammar is complete
            reason, complete = "stop", True
        elif len(req.input_ids) >= req.max_device_len:  # tokens received, not the (further) scheduled length
            reason = "length"
        chosen, top = (logprobs.row(row, req.params.logprobs)
                       if logprobs is not None and req.params.logprobs is not None else (None, None))
        if complete:  # the token is the output's last, not an EOS left out of it: sent, then the end alone
            replies += [Reply(req.uid, token, False, logprob=chosen, top_logprobs=top),
                        Reply(req.uid, None, True, reason)]
        else:
            replies.append(Reply(req.uid, token, reason is not None, reason, logprob=chosen, top_logprobs=top))
        if reason is not None:
            req.done = True
            finished.append(req)
    return replies, finished
