"""The CUDA wing: the Triton and CUDA kernels of a CUDA engine, each a plug-in the plan chooses.

``gemv.py``: one-row linears with the norm or activation folded in; ``split_k.py``: a narrow linear's inputs in
slices; ``fused_qkv.py``: QK-norm, RoPE and the KV write in one launch; ``small_decode.py``: decode attention
at small batches; ``paged_decode.py``: decode over fp8 pages (``split_merge_triton.py``: the split-KV helpers
both share); ``fp8_decode.py``/``fp8_decode.cu``: the CUDA fp8 decode; ``fp8_gather.py``: an fp8 pool's
sequences dequantised for prefill; ``race.py``: the sampler's picks; ``screened_head.py``: a greedy request's
LM head through an int8 screen; ``triton_available.py``: whether Triton runs here.

The kernels sit here, each named by the wing's rule (``<thing>.py`` the wrapper, ``<thing>_triton.py`` or
``<thing>.cu`` its kernel); what plugs them into the engine sits in a subpackage named for the part of the engine
it stands in for: ``attention/``, the attention backends beside the torch one, and ``graphs/``, the forward passes
captured as CUDA graphs (``graphs/step.py``: the engine's fast step). ``install.py`` installs the wing in one
call: the screen on the model's LM head, the attention backend and the graphs over it.
"""
