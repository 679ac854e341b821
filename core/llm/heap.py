"""A serving process hides its start-up heap from the garbage collector once it is built.

Collecting the oldest generation walks every tracked object and stops every thread while it does: in a process
holding torch, the model's modules and a tokenizer that is hundreds of thousands of objects, none of which will
ever be garbage, and a stream's next token waits behind the walk. Frozen, they are skipped; what the process
allocates afterwards (requests, replies, their cycles) is collected as before. The engine process, the
tensor-parallel ranks and the API process call this; an ``LLM`` in the user's own process leaves the user's
heap alone.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect what start-up left as garbage, then move everything still alive to the permanent generation.
    Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
