"""The live dashboard's page and the step records it streams: the replay page's panels (render/replay_page/draw.js)
driven by live.js instead of an embedded trace.

A record is the replay's step record plus what the page knows of each request it names (token counts, and the
prompt and completion only when the server was told to show text: they may be private). Without text the radix
tree's spans lose their token ids too, since ids decode back to the prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from core.events import StepEvent
from render.html_replay import page, step_record

# EventSource needs connect-src; everything else is as closed as the saved replay's page
CSP = "default-src 'none'; connect-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
PRIVATE = ("prompt", "completion")

Facts = Callable[[int], "dict[str, Any] | None"]


def dashboard_html(model: str, options: dict[str, Any], show_text: bool, history: int,
                   events_url: str = "dashboard/events", title: str = "minisgl dashboard") -> str:
    config = {"model": model, "options": options, "show_text": show_text, "history": history,
              "events_url": events_url}
    return page(config, "live.js", title, csp=CSP, data_id="dashboard-data")


def named_uids(event: StepEvent) -> set[int]:
    """Every request a step mentions: in the batch, queued, arrived, finished, preempted, or holding KV pages."""
    uids = {r.uid for r in event.reqs} | {w.uid for w in event.waits} | set(event.arrived) | set(event.finished)
    uids |= set(event.preempted)
    if event.kv is not None:
        uids |= {uid for uid, _ in event.kv.by_request}
    return uids


def dashboard_record(event: StepEvent, facts: Facts, show_text: bool,
                     decode: Callable[[list[int]], str] | None = None,
                     skipped: Iterable[StepEvent] = ()) -> dict[str, Any]:
    """One step for the page; ``skipped``: the steps since the viewer's previous one that it will never see, whose
    arrivals, finishes and requests are folded in so that no request slips past a viewer that lags."""
    skipped = list(skipped)
    record = step_record(event, decode if show_text else None)
    if skipped:
        record["arrived"] = sorted({u for e in skipped for u in e.arrived} | set(event.arrived))
        record["finished"] = sorted({u for e in skipped for u in e.finished} | set(event.finished))
    record["skipped"] = len(skipped)
    if record.get("radix") is not None and not show_text:
        for node in record["radix"]:
            node["first_tokens"], node["text"] = [], None
    uids = named_uids(event).union(*(named_uids(e) for e in skipped))
    requests = {}
    for uid in sorted(uids):
        known = facts(uid)
        if known is not None:
            requests[str(uid)] = {k: v for k, v in known.items() if show_text or k not in PRIVATE}
    record["requests"] = requests
    return record
