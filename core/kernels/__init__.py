"""Every custom kernel of the engine, and the dispatch that picks one.

The layers call one table, ``dispatch.py``: its ``TorchKernels`` is the reference (plain torch, runs anywhere);
every fast path is a plug-in beside it, in one of two wings, each installed by one call when the engine is
built from its plan (``install.py`` in each):

* ``cpu/``: the CPU's C kernels and the other forms of a float32 weight (panels, int8, bf16, 4-bit codes,
  oneDNN's packing), and ``precision.py``, the plan's CPU part (what ``--precision`` comes to here).
* ``cuda/``: the Triton and CUDA kernels of a CUDA engine.

One rule names a wing's files: ``<thing>.py`` is the torch-facing wrapper (shapes, checks, the call) and its
kernel sits beside it as ``<thing>_triton.py`` (Triton: imported by the wrapper lazily, at the first launch),
``<thing>.c`` or ``<thing>.cu`` (built at first use by ``c_build.py`` into MINISGL_HOME's cache). Here, shared
by both: ``choices.py`` (the plan's kernel switches), ``rope_table.py``, ``derived.py`` (what the kernels
derive from the weights, kept on disk) and ``c_build.py``.

Nothing here decides a switch: which kernels run is decided once when the engine is built
(core/engine/plan.py) and handed in.
"""
