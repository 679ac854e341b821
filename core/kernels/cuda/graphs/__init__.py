"""The CUDA wing's graphs: forward passes captured once and replayed, so the host launches one graph instead of
every kernel. ``decode.py``: a decode step, one graph per batch size of a ladder; ``prefill.py``: a full prefill
chunk.
"""
