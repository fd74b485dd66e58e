"""Decode attention that reads everything back from the (FP8) KV cache.

The kernel it stands for takes FP8 queries, keys and values when it runs a
prefill, hence the FP8 Q/K/V prefill hook registered for it below.
"""
from __future__ import annotations

import torch

from tinyserve.attention.base import AttentionBackend, causal_attention
from tinyserve.attention.registry import register_backend
from tinyserve.forward_batch import ForwardBatch
from tinyserve.hooks import register_prefill_hook
from tinyserve.quant.fp8 import fake_quant_per_tensor


@register_backend("paged_fp8")
class PagedFp8Backend(AttentionBackend):
    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        fb.cache.write(layer, fb.start, k, v)
        k_all, v_all = fb.cache.read(layer, fb.end)
        return causal_attention(q, k_all, v_all, fb.start)


@register_prefill_hook("paged_fp8")
def fp8_qkv_quant_hook(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize Q/K/V to float8_e4m3fn with one scale per tensor."""
    return fake_quant_per_tensor(q), fake_quant_per_tensor(k), fake_quant_per_tensor(v)
