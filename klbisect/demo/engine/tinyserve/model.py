"""A tiny decoder-only transformer (RMSNorm, RoPE, SwiGLU) with a KV cache.

Weights are generated from a fixed seed, so every checkout of the engine
serves the same model without downloading anything.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tinyserve.attention.base import AttentionBackend
from tinyserve.attention.registry import resolve_backend
from tinyserve.config import ModelConfig
from tinyserve.forward_batch import ForwardBatch
from tinyserve.hooks import apply_prefill_hooks


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)


def rope_tables(config: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, heads, tokens, head_dim]; cos/sin: [tokens, head_dim/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class LayerWeights:
    def __init__(self, config: ModelConfig, gen: torch.Generator) -> None:
        d, ff = config.hidden_size, config.intermediate_size
        std = config.init_std
        self.qkv = torch.randn(d, 3 * d, generator=gen) * (std / d**0.5)
        self.o = torch.randn(d, d, generator=gen) * (1.0 / d**0.5)
        self.gate_up = torch.randn(d, 2 * ff, generator=gen) * (1.0 / d**0.5)
        self.down = torch.randn(ff, d, generator=gen) * (1.0 / ff**0.5)
        self.attn_norm = torch.ones(d)
        self.mlp_norm = torch.ones(d)

    def to(self, device: torch.device) -> "LayerWeights":
        for name, value in vars(self).items():
            setattr(self, name, value.to(device))
        return self


class TinyTransformer:
    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend, device: torch.device) -> None:
        self.config = config
        self.attn_backend = attn_backend
        self.device = device
        # Generated on the CPU so that every device gets bit-identical weights.
        gen = torch.Generator().manual_seed(config.weight_seed)
        d, vocab = config.hidden_size, config.vocab_size
        self.embed = torch.randn(vocab, d, generator=gen).to(device)
        self.layers = [LayerWeights(config, gen).to(device) for _ in range(config.num_layers)]
        self.final_norm = torch.ones(d, device=device)
        self.lm_head = (torch.randn(d, vocab, generator=gen) * (1.0 / d**0.5)).to(device)
        self.cos, self.sin = rope_tables(config, device)

    def attention(
        self, layer: int, x: torch.Tensor, fb: ForwardBatch, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        cfg = self.config
        b, t, _ = x.shape
        # [3, batch, heads, tokens, head_dim]; RoPE goes to q and k in one go.
        qkv = (x @ self.layers[layer].qkv).view(b, t, 3, cfg.num_heads, cfg.head_dim).permute(2, 0, 3, 1, 4)
        qk = apply_rope(qkv[:2], cos, sin)
        q, k, v = qk[0], qk[1], qkv[2]
        impl = resolve_backend(self.attn_backend, fb.mode)
        if fb.mode.is_extend():
            q, k, v = apply_prefill_hooks(impl.name, q, k, v)
        out = impl.forward(layer, q, k, v, fb)
        return out.transpose(1, 2).reshape(b, t, cfg.hidden_size) @ self.layers[layer].o

    def mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = (x @ self.layers[layer].gate_up).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ self.layers[layer].down

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Logits [batch, new_tokens, vocab] for the batch's new tokens."""
        x = self.embed[fb.input_ids]
        cos, sin = self.cos[fb.positions], self.sin[fb.positions]
        for i, w in enumerate(self.layers):
            x = x + self.attention(i, rms_norm(x, w.attn_norm), fb, cos, sin)
            x = x + self.mlp(i, rms_norm(x, w.mlp_norm))
        return (rms_norm(x, self.final_norm) @ self.lm_head) * self.config.logit_scale
