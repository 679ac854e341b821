"""A soak run: a few thousand short requests through one LLM, with memory and the pool stable throughout."""

from __future__ import annotations

import random

import psutil

from core import LLM, SamplingParams


def test_thousands_of_short_requests_keep_memory_and_pool_stable(model_dirs):
    llm = LLM(model_dirs["llama"], max_running_req=32, page_size=4, num_pages=256, max_seq_len=64)
    rng = random.Random(0)
    process = psutil.Process()
    rss, served = [], 0
    for call in range(50):
        prompts = [[rng.randrange(256) for _ in range(rng.randint(1, 12))] for _ in range(80)]
        params = [SamplingParams(max_tokens=rng.randint(1, 4), ignore_eos=rng.random() < 0.5,
                                 temperature=rng.choice([0.0, 0.8]), seed=rng.randrange(1000))
                  for _ in prompts]
        out = llm.generate(prompts, params)
        served += len(out)
        assert all(r["finish_reason"] in ("stop", "length") for r in out)
        assert all(len(r["token_ids"]) <= p.max_tokens for r, p in zip(out, params))
        stats = llm.stats()
        assert stats["free_rows"] == stats["total_rows"]
        assert stats["free_pages"] + stats["cached_pages"] == stats["total_pages"]
        rss.append(process.memory_info().rss)
    assert served == 4000
    growth_mb = (rss[-1] - rss[1]) / 2**20
    assert growth_mb < 32, f"RSS grew by {growth_mb:.1f} MiB over the run"
