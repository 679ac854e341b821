"""The exit codes of every ``minisgl`` command, in one place so that they mean the same thing everywhere.

A script can tell the four outcomes apart without reading any output (the README lists them too).
"""

from __future__ import annotations

DONE = 0  # every prompt finished (verify: and matched transformers)
SOME_FAILED = 1  # the run finished, but some results are errors (verify: or differ from transformers)
USAGE = 2  # a mistake in what was asked: an option, the prompts file, the model; nothing was run
INTERRUPTED = 130  # stopped with Ctrl-C (128 + SIGINT, as shells report it)

