"""Numerics of the fake engine's prefill path (a planted commit changes them).

Prefill and decode run different kernels in a real engine. Here the prefill
GEMMs take bfloat16 inputs while decode stays in float32, and the prefill
logits carry an emulated accumulation-order error; together they give the
small prefill-vs-decode KL of a healthy engine (about 0.004; about 0.010
with the FP8 hook on).
"""

# Std of the emulated accumulation error on the prefill logits.
PREFILL_ACCUM_ERROR = 0.1

# Route the prefill GEMM inputs through an FP8 (e4m3, per-tensor scale)
# quantization hook.
PREFILL_FP8_GEMM = False
