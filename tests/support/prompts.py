"""Prompts of varied lengths around the page sizes (1, 16) the tests use, reproducible from a seed."""

from __future__ import annotations

import random


def varied_prompts(n: int, seed: int = 0, vocab: int = 256) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.choice([1, 3, 7, 16, 17, 33]))] for _ in range(n)]
    max_tokens = [rng.randint(1, 12) for _ in range(n)]
    return prompts, max_tokens
