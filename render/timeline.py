"""The per-request timeline: for each request, what it did in every step, one character a step.

``P`` it was prefilled, ``D`` it decoded, ``·`` it was waiting (queued, or paused while another phase ran),
``▸`` it arrived in that step and waited, ``x`` it was preempted (gave its KV pages back, queued again with the
tokens it generated, to be recomputed), blank before it arrived and once it finished. Read down a column to
see a batch; read along a row to see a request arrive, wait, join and leave: continuous batching at a glance.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from core.events import StepEvent
from render.step_detail import SHORT_REASON
from render.prompt_echo import PromptCell
from render.style import PHASE_STYLE, titled_table

PREFILL, DECODE, WAITING, ARRIVED, GONE, PREEMPTED = "P", "D", "·", "▸", " ", "x"
_CELL_STYLE = {PREFILL: PHASE_STYLE["prefill"], DECODE: PHASE_STYLE["decode"], WAITING: "dim", ARRIVED: "blue",
               PREEMPTED: "bold red"}
LEGEND = ("P prefill · D decode · '·' waiting · ▸ arrived, waiting · x preempted (pages given back, queued "
          "again) · blank: not arrived yet, or done")


def arrival_steps(events: Sequence[StepEvent]) -> dict[int, int]:
    """The step each uid arrived in (just before it was scheduled)."""
    arrived: dict[int, int] = {}
    for event in events:
        for uid in event.arrived:
            arrived.setdefault(uid, event.step)
    return arrived


def wait_summary(events: Sequence[StepEvent]) -> dict[int, str]:
    """Per uid, why it waited and for how many steps: ``row×3 FCFS×1``."""
    counts: dict[int, dict[str, int]] = {}
    for event in events:
        for wait in event.waits:
            kinds = counts.setdefault(wait.uid, {})
            kinds[wait.kind] = kinds.get(wait.kind, 0) + 1
    return {uid: " ".join(f"{SHORT_REASON.get(kind, kind)}×{n}" for kind, n in kinds.items())
            for uid, kinds in counts.items()}


def request_states(events: Sequence[StepEvent], uids: Sequence[int]) -> dict[int, str]:
    """Each uid's state in every step, as a string with one character per step."""
    rows: dict[int, list[str]] = {uid: [] for uid in uids}
    done: set[int] = set()
    arrived_at = arrival_steps(events)
    for event in events:
        in_step = {r.uid for r in event.reqs}
        for uid in uids:
            arrival = arrived_at.get(uid, events[0].step)
            if uid in in_step:
                rows[uid].append(PREFILL if event.phase == "prefill" else DECODE)
            elif uid in event.preempted:
                rows[uid].append(PREEMPTED)
            elif uid in done or event.step < arrival:
                rows[uid].append(GONE)
            else:
                rows[uid].append(ARRIVED if event.step == arrival and arrival > events[0].step else WAITING)
        done.update(event.finished)
    return {uid: "".join(states) for uid, states in rows.items()}


def ruler(num_steps: int) -> str:
    """Step numbers every five columns, aligned with the timeline characters below them."""
    out = [" "] * num_steps
    for i in range(0, num_steps, 5):
        label = str(i)
        if i + len(label) <= num_steps:
            out[i:i + len(label)] = label
    return "".join(out)


def timeline_table(events: Sequence[StepEvent], labels: Sequence[str], uids: Sequence[int] | None = None,
                   title: str = "request timeline") -> Table:
    uids = list(range(len(labels))) if uids is None else list(uids)
    states = request_states(events, uids)
    table = titled_table(title, LEGEND)
    table.add_column("uid", justify="right", no_wrap=True)
    table.add_column("prompt", max_width=32)  # the column that shrinks on a narrow screen (PromptCell)
    table.add_column(Text(ruler(len(events)) or "step", style="dim"), no_wrap=True)
    arrived_at = arrival_steps(events)
    late = any(step > events[0].step for step in arrived_at.values()) if events else False
    if late:
        table.add_column("arrived", justify="right", no_wrap=True)
    table.add_column("steps in", justify="right", no_wrap=True)
    table.add_column("waited", justify="right", no_wrap=True)
    reasons = wait_summary(events)
    if reasons:
        table.add_column("why it waited", style="yellow", overflow="fold")
    for uid, label in zip(uids, labels):
        row = states[uid]
        ran = sum(c in (PREFILL, DECODE) for c in row)
        if not ran:
            cells = Text("never scheduled", style="red")
        else:
            cells = Text()
            for char in row:
                cells.append(char, style=_CELL_STYLE.get(char, ""))
        waited = sum(c in (WAITING, ARRIVED, PREEMPTED) for c in row) if ran else 0
        arrival = [f"step {arrived_at[uid]}" if uid in arrived_at else ""] if late else []
        why = [reasons.get(uid, "")] if reasons else []
        table.add_row(str(uid), PromptCell(label), cells, *arrival, str(ran), str(waited), *why)
    return table
