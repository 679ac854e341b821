"""The CUDA wing's graphs: forward passes captured once and replayed, so the host launches one graph instead of
every kernel. ``decode.py``: a decode step, one graph per batch size of a ladder; ``prefill.py``: a full prefill
chunk; ``step.py``: both as the engine's fast step (core/engine/fast_step.py), which picks the graph a batch
replays.
"""
