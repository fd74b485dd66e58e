"""Reference attention in plain torch: fresh K/V for new tokens, cached K/V for the prefix."""
from __future__ import annotations

import torch

from tinyserve.attention.base import AttentionBackend, causal_attention
from tinyserve.attention.registry import register_backend
from tinyserve.forward_batch import ForwardBatch


@register_backend("torch_native")
class TorchNativeBackend(AttentionBackend):
    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        fb.cache.write(layer, fb.start, k, v)
        if fb.start > 0:
            k_prefix, v_prefix = fb.cache.read(layer, fb.start)
            k = torch.cat([k_prefix, k], dim=2)
            v = torch.cat([v_prefix, v], dim=2)
        return causal_attention(q, k, v, fb.start)
