"""The interface every attention backend implements."""
from __future__ import annotations

import math

import torch

from tinyserve.forward_batch import ForwardBatch


class AttentionBackend:
    """Computes attention for one layer and keeps the KV cache up to date."""

    name: str = "base"

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        """q, k, v: [batch, heads, new_tokens, head_dim]; returns the same shape as q."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int
) -> torch.Tensor:
    """Softmax attention of new queries (at positions start..) over k/v of positions 0..end."""
    t, s = q.shape[2], k.shape[2]
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if t > 1:
        qpos = torch.arange(start, start + t, device=q.device)[:, None]
        kpos = torch.arange(s, device=q.device)[None, :]
        scores = scores.masked_fill(kpos > qpos, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)
