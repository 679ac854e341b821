"""The CPU wing: the fast paths of a float32 CPU engine, each a plug-in the plan chooses.

``gemm.py``/``gemm.c``: every linear in C on weights packed into panels (AVX-512), the norm or SiLU-and-mul in
the same call; ``screened_head.py``: a greedy batch's LM head through an int8 screen (on gemm.c);
``decode.py``/``decode.c``: a single request's whole decode step as one C call, mapped onto the model by
``decode_model.py``; ``attention.py``: decode attention in C (on decode.c); the weights' other forms:
``int8_weights.py``, ``bf16_weights.py``, ``four_bit.py`` (4-bit codes found in float32 weights),
``onednn_packed.py``; ``features.py``: what this CPU can run, read once. ``precision.py`` is the plan's CPU
part (what ``--precision`` comes to, whether the C kernels run) and ``install.py`` puts the chosen paths in
place on the model in one call.
"""
