"""What one forward pass is doing, handed to every attention backend."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from tinyserve.kv_cache import KVCache


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill, possibly on top of a cached prefix
    DECODE = "decode"  # one new token per sequence

    def is_extend(self) -> bool:
        return self is ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE


@dataclass
class ForwardBatch:
    """A batch of equal-length sequences; ``start`` tokens are already cached."""

    mode: ForwardMode
    input_ids: torch.Tensor  # [batch, new_tokens]
    positions: torch.Tensor  # [new_tokens]
    cache: KVCache
    start: int

    @property
    def end(self) -> int:
        return self.start + self.input_ids.shape[1]
