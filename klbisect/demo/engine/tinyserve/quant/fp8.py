"""FP8 (float8_e4m3fn) quantization, per tensor.

Tensors are quantized and immediately dequantized ("fake quant"): the
arithmetic afterwards stays in the compute dtype, the rounding error is real.
"""
from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantize_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize with one dynamic scale for the whole tensor (amax / FP8_MAX)."""
    amax = x.abs().amax().clamp(min=1e-12)
    scale = amax.float() / FP8_MAX
    # float8_e4m3fn has no inf: out-of-range values would become NaN, so clamp.
    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor | float, dtype: torch.dtype) -> torch.Tensor:
    return q.to(dtype) * scale


def fake_quant_per_tensor(x: torch.Tensor) -> torch.Tensor:
    q, scale = quantize_per_tensor(x)
    return dequantize(q, scale, x.dtype)


def fake_quant_static(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Round to FP8 with a fixed scale, as an FP8 KV cache does."""
    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.to(x.dtype) * scale
