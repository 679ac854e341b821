"""The CUDA wing's attention backends, each a plug-in beside the torch reference (core/attention/torch_backend.py)
that the plan chooses: ``flashinfer_paged.py`` for a bf16/fp16 pool (with ``small_decode_graphs.py``, the small
Triton decode's fixed buffers under CUDA graphs) and ``flashinfer_fp8.py`` for an fp8 pool, both on
``flashinfer_common.py``; ``paged_torch.py``, the torch backend whose decode reads fp8 pages through a Triton
kernel (``--attention torch`` with an fp8 pool on CUDA).
"""
