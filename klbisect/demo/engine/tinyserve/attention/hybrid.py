"""A backend that sends prefill and decode to two different backends."""
from __future__ import annotations

import torch

from tinyserve.attention.base import AttentionBackend
from tinyserve.forward_batch import ForwardBatch


class HybridAttnBackend(AttentionBackend):
    name = "hybrid"

    def __init__(self, prefill_backend: AttentionBackend, decode_backend: AttentionBackend) -> None:
        self.prefill_backend = prefill_backend
        self.decode_backend = decode_backend

    @property
    def primary(self) -> AttentionBackend:
        """The backend that owns the KV cache layout (the decode one)."""
        return self.decode_backend

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        impl = self.prefill_backend if fb.mode.is_extend() else self.decode_backend
        return impl.forward(layer, q, k, v, fb)

    def __repr__(self) -> str:
        return f"HybridAttnBackend(prefill={self.prefill_backend!r}, decode={self.decode_backend!r})"
