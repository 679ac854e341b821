"""Every custom kernel of the engine, and the dispatch that picks one.

Named for what each file is: ``<thing>_triton.py`` holds a Triton kernel (it imports triton at the top, so
only its wrapper imports it, lazily, at the first launch) and ``<thing>.py`` the Python wrapper that sizes and
launches it. ``dispatch.py`` is the table of per-token kernels and linears the layers call,
``onednn_packed.py`` the CPU's pre-packed float32 weights, ``triton_available.py`` whether Triton can run.
``cpu_decode.c`` is a single request's whole decode step in C for an AVX2 CPU, ``cpu_decode.py`` its ctypes
wrapper, and ``c_build.py`` compiles C at first use into MINISGL_HOME's cache.

Nothing here decides a switch: which kernels run is decided once when the engine is built
(core/engine/plan.py) and handed in.
"""
