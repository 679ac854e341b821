"""A launched step's sampled tokens, handed to their requests: judged from what was scheduled and from the tokens
the host has received, never from lengths a later launch already moved on (core/scheduler/loops.py)."""

from __future__ import annotations

from core.constrain.masks import consume
from core.request import Req
from core.scheduler.reply import Reply
from core.scheduler.step import InFlight


def take_tokens(flight: InFlight, tokens: list[int], eos_token_ids: frozenset[int]) -> tuple[list[Reply], list[Req]]:
    """Append each sampled token of a step to its request; the replies to send, and the requests that just
    finished (marked done: a step already launched for them has its token dropped). Those whose last token
    completed their grammar, seen as the step's masks were filled (marked done then), end here too."""
    prepared, logprobs = flight.prepared, flight.output.logprobs
    replies = [Reply(req.uid, None, True, "stop") for req in flight.grammar_complete]
    finished = list(flight.grammar_complete)
    for row, (req, token, samples) in enumerate(zip(prepared.batch.reqs, tokens, prepared.samples)):
        if not samples or req.done:  # a prompt chunk, or a request already answered
            continue
        req.input_ids.append(token)
        req.output_ids.append(token)
        reason, complete = None, False
        if not req.params.ignore_eos and token in eos_token_ids or token in req.params.stop_token_ids:
            reason = "stop"
        elif len(req.input_ids) >= req.max_device_len:  # tokens received, not the (further) scheduled length
            reason = "length"
            if req.matcher is not None and completes_grammar(req, token):
                reason, complete = "stop", True
        elif req.matcher is not None:  # consumed as its next masks are filled (core/scheduler/grammar_step.py)
            req.unconsumed.append(token)
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


def completes_grammar(req: Req, token: int) -> bool:
    """Whether a request's last token completes its grammar (then it stops rather than running out of length):
    its matcher moved on here, on the loop's thread, as no fill is running."""
    tokens, req.unconsumed = req.unconsumed + [token], []
    return bool(consume([req.matcher], [tokens], parallel=False))
