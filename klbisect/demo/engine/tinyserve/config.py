"""Model and server configuration."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the built-in model; weights are generated from ``weight_seed``."""

    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    init_std: float = 1.0
    logit_scale: float = 6.0
    weight_seed: int = 20250611
    kv_cache_scale: float = 56.0  # the checkpoint's K/V scale for FP8 KV caches

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class ServerArgs:
    """How the engine serves the model: attention backends and KV cache dtype."""

    attention_backend: str = "hybrid"
    prefill_attention_backend: str = "torch_native"
    decode_attention_backend: str = "paged_fp8"
    kv_cache_dtype: str = "fp8_e4m3"
    device: str = "cpu"
