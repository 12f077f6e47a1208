"""Triton kernels for smoothed FP8 attention on Hopper (each module names its torch twin).

- ``e4m3``: explicit round-to-E4M3 in Triton (twin: ``workbench.attention.quant.round_to_e4m3``).
- ``kv_stats``: fused, deterministic mu_K / mu_V / V range statistics.
- ``quantize``: fused centering + E4M3 quantization of Q, K (block scales) and V (channel scales),
  plus the V-bias correction vector.
- ``attention_fp8``: the FP8 attention forward (online softmax, P in E4M3, fused epilogue).
- ``merge``: the merged output pass (BF16 prefix rows + corrected FP8 rows).
- ``dispatch``: the full recipe call and ``try_kernel`` used by ``workbench.attention.runner``.
- ``config``: the frozen tiling configs every entry point takes (``KernelConfig.h200()`` =
  ``DEFAULT``, the measured values).

Importing this package needs triton; the kernels run on CUDA (Hopper for speed) and in Triton's
interpreter (``TRITON_INTERPRET=1``) on CPU.
"""
