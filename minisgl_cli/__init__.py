"""The ``minisgl`` command line tool.

Libraries underneath (transformers' GGUF conversion, weight loading) draw their own tqdm progress bars, which
would fight the Rich status line and live table for the terminal. tqdm reads TQDM_DISABLE when it is first
imported, so it is set here, before anything imports it; export TQDM_DISABLE=0 to see those bars again.
"""

import os

os.environ.setdefault("TQDM_DISABLE", "1")
