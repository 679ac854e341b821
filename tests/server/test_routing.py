"""Which engine a request goes to under data parallelism (serving/data_parallel.py), without any engine."""

from serving.data_parallel import BLOCK, PrefixMemory, pick_engine, prefix_keys


def test_a_prompt_goes_where_its_longest_prefix_was_sent():
    memories = [PrefixMemory(), PrefixMemory()]
    shared = list(range(3 * BLOCK))
    memories[0].remember(prefix_keys(shared[:BLOCK]))
    memories[1].remember(prefix_keys(shared))
    assert pick_engine(prefix_keys(shared + [7]), memories, [(5, 9), (0, 0)]) == 1
    assert pick_engine(prefix_keys(shared[:BLOCK] + [1] * BLOCK), memories, [(0, 0), (0, 0)]) == 0


def test_without_a_match_the_least_loaded_then_the_least_used_wins():
    memories = [PrefixMemory(), PrefixMemory(), PrefixMemory()]
    keys = prefix_keys(list(range(2 * BLOCK)))
    assert pick_engine(keys, memories, [(2, 0), (1, 7), (1, 3)]) == 2
    assert pick_engine(keys, memories, [(0, 0), (0, 0), (0, 0)]) == 0
    assert pick_engine(prefix_keys([1] * (BLOCK - 1)), memories, [(1, 0), (0, 0), (1, 0)]) == 1  # no whole block


def test_memory_forgets_the_oldest_prefixes_first():
    memory = PrefixMemory(capacity=2)
    a, b = prefix_keys(list(range(BLOCK))), prefix_keys(list(range(1, BLOCK + 1)))
    memory.remember(a)
    memory.remember(b)
    memory.remember(prefix_keys(list(range(2, BLOCK + 2))))
    assert memory.matched(a) == 0 and memory.matched(b) == 1
