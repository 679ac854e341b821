"""One HTTP request's engine requests: a choice each (every prompt's ``n``), their replies into one queue, read
as they come until every choice has its final one. Whichever way a response ends early (the client disconnects,
the server shuts down, a send fails), its requests are aborted so their pages come back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request

from core.scheduler.reply import Reply
from serving.api.bridge import EngineBridge, Tracked
from serving.api.protocol import ApiError, ChatRequest, CompletionRequest
from serving.api.request_log import record_of


class ClientGone(Exception):
    pass


@dataclass
class Call:
    """One HTTP request's engine requests, a choice each (every prompt's ``n`` choices, in order), and the one
    queue their replies come into."""

    tracked: list[Tracked]
    queue: asyncio.Queue
    prompt_tokens: int  # each prompt counted once, however many choices it has

    def __post_init__(self) -> None:
        self.index = {tracked.uid: i for i, tracked in enumerate(self.tracked)}

    @property
    def uids(self) -> list[int]:
        return [tracked.uid for tracked in self.tracked]

    def by_choice(self, ready: list[Reply]) -> list[tuple[int, list[Reply]]]:
        """The ready replies grouped by choice, each group in arrival order."""
        if len(self.tracked) == 1:  # the usual request: nothing to group
            return [(0, ready)]
        groups: dict[int, list[Reply]] = {}
        for reply in ready:
            groups.setdefault(self.index[reply.uid], []).append(reply)
        return list(groups.items())


def start_all(bridge: EngineBridge, prompts: list[list[int]], body: CompletionRequest | ChatRequest) -> Call:
    """Every choice of every prompt submitted, their replies into one queue; if one is refused (a prompt too
    long, a full queue), those already started are aborted and the refusal stands for the whole request."""
    wanted = len(prompts) * body.n
    if bridge.max_queue is not None and wanted > bridge.max_queue:  # a 503 would say retry, in vain
        raise ApiError(400, f"this request asks for {wanted} choices (prompts x n); the server queues at most "
                            f"{bridge.max_queue} requests (--max-queue)", param="n")
    queue: asyncio.Queue = asyncio.Queue()
    started: list[Tracked] = []
    try:
        for ids in prompts:  # a prompt's choices, unset max_tokens what its length leaves
            started += [bridge.start(ids, params, queue)
                        for params in body.choice_params(bridge.default_max_tokens(len(ids)),
                                                         bridge.llm.sampling_defaults)]
    except ApiError:
        for tracked in started:
            bridge.abort(tracked)
        raise
    return Call(started, queue, sum(len(ids) for ids in prompts))


async def replies(bridge: EngineBridge, call: Call, request: Request) -> AsyncIterator[list[Reply]]:
    """The replies of the request's choices as they come, every one ready at once together, until each choice
    has its final one; a vanished client aborts them all. A task beside it waits for the disconnect and wakes
    it, streamed or not and however often tokens come, so waiting for a reply is a plain wait on the queue
    (no timer per reply)."""
    watch = asyncio.create_task(wake_on_disconnect(request, call.queue))
    open_choices = len(call.tracked)
    try:
        while open_choices:
            ready = [await call.queue.get()]
            while not call.queue.empty():
                ready.append(call.queue.get_nowait())
            for reply in ready:
                if reply is None:
                    raise ClientGone()
                open_choices -= reply.finished
            yield ready
    finally:  # also on cancellation, a failed send, or the generator closed half way
        watch.cancel()
        for tracked in call.tracked:
            bridge.abort(tracked)
        record = record_of(request)
        record.uids, record.prompt_tokens = call.uids, call.prompt_tokens
        record.finish_reasons = [t.finish_reason if t.finished else "abort" for t in call.tracked]
        record.first_token_at = min((t.first_token_at for t in call.tracked if t.first_token_at), default=None)


async def wake_on_disconnect(request: Request, queue: asyncio.Queue) -> None:
    """Once the client has gone, a None in the request's queue wakes its reader. The body has been read,
    so the server's next message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    queue.put_nowait(None)


def failure(bridge: EngineBridge, error: str | None) -> ApiError:
    """A request answered with an error: the client's fault (400) unless the engine failed (500)."""
    engine_gone = error is None or bridge.llm.dead is not None
    return ApiError(500 if engine_gone else 400, error or "the request failed",
                    kind="server_error" if engine_gone else "invalid_request_error")
