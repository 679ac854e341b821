"""The serving processes freeze their start-up heap: the collector's oldest generation stops walking it, and what
is allocated afterwards is still collected. Run in a child interpreter, so the test process's heap is untouched."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import gc, json, weakref
from core.llm.heap import freeze_startup_heap
startup = [[i] for i in range(20000)]  # stands for the model's and the tokenizer's objects
tracked_before = len(gc.get_objects())
frozen = freeze_startup_heap()
tracked_after = len(gc.get_objects())

class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made while serving: only the collector frees it
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"before": tracked_before, "frozen": frozen, "after": tracked_after, "cycle_freed": gone() is None,
                  "startup_alive": len(startup)}))
"""


def test_the_startup_heap_is_frozen_and_later_cycles_are_still_collected():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=True)
    seen = json.loads(out.stdout)
    assert seen["frozen"] >= 20000 and seen["before"] >= 20000
    assert seen["after"] < seen["before"] // 10  # the oldest generation no longer holds the start-up objects
    assert seen["cycle_freed"] and seen["startup_alive"] == 20000
