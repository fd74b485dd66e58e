"""A contiguous per-layer KV cache, stored in the configured KV cache dtype."""
from __future__ import annotations

import torch

from tinyserve.quant.fp8 import fake_quant_static

KV_CACHE_DTYPES = ("auto", "bf16", "fp8_e4m3")


class KVCache:
    """K/V of ``batch`` equal-length sequences for every layer.

    Values are rounded to the cache dtype on write, as a real cache of that
    dtype would store them; reads return compute-dtype tensors. K and V of a
    layer share one tensor so that a write rounds both in one go.
    """

    def __init__(
        self,
        num_layers: int,
        batch: int,
        num_heads: int,
        head_dim: int,
        max_len: int,
        dtype: str,
        device: torch.device | str,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> None:
        if dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv cache dtype {dtype!r}; choose from {KV_CACHE_DTYPES}")
        shape = (2, batch, num_heads, max_len, head_dim)
        # Only positions below ``length`` are ever read, so no need to zero-fill.
        self.kv = [torch.empty(shape, device=device) for _ in range(num_layers)]
        self.dtype = dtype
        self.scale = torch.tensor([k_scale, v_scale], device=device).view(2, 1, 1, 1, 1)
        self.length = 0

    @property
    def batch(self) -> int:
        return self.kv[0].shape[1]

    def _store(self, kv: torch.Tensor) -> torch.Tensor:
        if self.dtype == "fp8_e4m3":
            return fake_quant_static(kv, self.scale)
        if self.dtype == "bf16":
            return kv.to(torch.bfloat16).to(kv.dtype)
        return kv

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[2]
        self.kv[layer][:, :, :, start:end] = self._store(torch.stack((k, v)))

    def read(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.kv[layer]
        return kv[0, :, :, :end], kv[1, :, :, :end]

    def expand(self, batch: int) -> "KVCache":
        """A cache of ``batch`` rows that all start with this (one-row) cache's prefix."""
        if self.batch != 1:
            raise ValueError("only a single-sequence cache can be expanded")
        out = KVCache.__new__(KVCache)
        out.kv = [t.expand(-1, batch, -1, -1, -1).clone() for t in self.kv]
        out.dtype, out.scale, out.length = self.dtype, self.scale, self.length
        return out
