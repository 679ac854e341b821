"""A trace as one self-contained HTML page that replays the run in any browser, offline.

The page carries the trace as JSON and its own CSS and JavaScript inline (render/replay_page/); its
Content-Security-Policy forbids every network request, so it opens the same from a disk, a mail attachment or
a phone. It is a function of the trace alone (no clock, no paths), so the same trace gives the same bytes:
a live run's page and the page replayed from its ``--trace-out`` file are identical.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from core.events import StepEvent
from render.lifecycle import request_lives
from render.perfetto import kv_parts
from render.trace_format import Trace

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"

# One page for both views: the replay (replay.js, the trace embedded) and the live dashboard (live.js, steps
# streamed); the panels and draw.js are shared, and each boot script shows the controls it uses.
_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>{title}</title>
<style>
{css}</style>
</head>
<body>
<h1>{title}</h1>
<div class="settings" id="settings"></div>
<div class="controls">
  <button id="prev" type="button" title="previous step (←)">◀</button>
  <button id="play" type="button" title="play / pause (space)">▶ play</button>
  <button id="next" type="button" title="next step (→)">▶▶</button>
  <input id="slider" type="range" min="0" max="0" value="0" step="1" aria-label="step">
  <span id="step-label"></span>
  <select id="speed" aria-label="speed">
    <option value="1000">1 step/s</option><option value="400" selected>2.5 steps/s</option>
    <option value="150">7 steps/s</option>
  </select>
  <button id="radix-toggle" type="button" hidden>show radix tree</button>
  <span id="connection" hidden></span>
</div>
<div class="panels">
  <section class="panel wide" id="figures-panel" hidden><h2>live figures</h2><div id="figures"></div></section>
  <section class="panel"><h2>batch</h2><div id="batch"></div></section>
  <section class="panel"><h2 id="queue-title">queue</h2><div id="queue"></div></section>
  <section class="panel"><h2>KV pool</h2><div id="kv"></div></section>
  <section class="panel" id="radix-panel" hidden><h2>radix tree</h2><div id="radix"></div></section>
  <section class="panel" id="request-panel" hidden><h2>followed request</h2><div id="request"></div></section>
  <section class="panel wide"><h2>requests over time</h2>
    <div class="gantt" id="gantt"><div class="labels" id="gantt-labels"></div>
      <div><div class="bars" id="gantt-bars"></div>
        <div class="axis"><span id="axis-start"></span><span id="axis-end"></span></div></div></div>
    <div class="legend"><span><span class="swatch w"></span>waiting</span><span><span class="swatch P"></span>prefill</span>
      <span><span class="swatch D"></span>decode</span><span><span class="swatch p"></span>paused (other phase)</span>
      <span><span class="swatch x"></span>preempted (pages given back, queued again)</span>
      <span>| arrival · red band: this step · click to jump, click a uid to follow it</span></div>
  </section>
  <section class="panel wide" id="generations-panel"><h2>generations</h2><div id="generations"></div></section>
</div>
<script type="application/json" id="{data_id}">{data}</script>
<script>
{draw}</script>
<script>
{js}</script>
</body>
</html>
"""


def _asset(name: str) -> str:
    return resources.files("render").joinpath("replay_page", name).read_text(encoding="utf-8")


def page_data(trace: Trace) -> dict[str, Any]:
    """What the page's script reads: the trace's events, each request's state per step, the KV parts."""
    steps = [step_record(event, lambda tokens: trace.token_text.get(tuple(tokens))) for event in trace.events]
    lives = request_lives(trace.events, len(trace.header.prompts))
    return {"model": trace.header.model, "options": trace.header.options, "prompts": list(trace.labels_by_uid),
            "steps": steps, "lives": [{"uid": life.uid, "arrival": life.arrival_step, "states": life.states}
                                      for life in lives],
            "has_radix": any(e.radix is not None for e in trace.events), "results": trace.results}


def step_record(event: StepEvent, span_text: Callable[[list[int]], str | None] | None = None) -> dict[str, Any]:
    """One step as the page's panels read it: the event, its KV pool split into parts, and (``span_text``) each
    radix node's first tokens as text."""
    record = event.to_dict()
    parts = kv_parts(event)
    record["kv_parts"] = {"by_request": [list(p) for p in event.kv.by_request] if event.kv else None,
                          **parts, "total": event.kv.total if event.kv else event.kv_pages_total}
    if event.radix is not None:
        for node in record["radix"]:
            node["text"] = span_text(node["first_tokens"]) if span_text is not None else None
    return record


def _script_safe(text: str) -> str:
    """JSON inside a <script> element: '</' and '<!--' must not appear, or the HTML parser ends it early."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page(data: dict[str, Any], boot: str, title: str, csp: str = _CSP, data_id: str = "trace-data") -> str:
    """The page with ``data`` embedded as JSON and ``boot`` (a script in replay_page/) driving the shared panels."""
    text = _script_safe(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return _PAGE.format(csp=csp, title=html.escape(title), css=_asset("replay.css"), draw=_asset("draw.js"),
                        js=_asset(boot), data=text, data_id=data_id)


def html_replay(trace: Trace, title: str = "minisgl trace") -> str:
    return page(page_data(trace), "replay.js", title)


def save_html(trace: Trace, path: Path | str, title: str = "minisgl trace") -> None:
    Path(path).write_text(html_replay(trace, title), encoding="utf-8")
