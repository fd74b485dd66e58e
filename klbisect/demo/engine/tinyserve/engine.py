"""The serving loop: prefill, decode with the KV cache, sampling, scoring."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tinyserve.attention import create_backend
from tinyserve.config import ModelConfig, ServerArgs
from tinyserve.forward_batch import ForwardBatch, ForwardMode
from tinyserve.kv_cache import KVCache
from tinyserve.model import TinyTransformer


@dataclass
class GenerateOutput:
    output_ids: torch.Tensor  # [batch, new_tokens]
    output_logprobs: torch.Tensor  # [batch, new_tokens], logprob of each sampled token
    cache: KVCache  # holds prompt + output, except the last output token


class Engine:
    def __init__(self, model_config: ModelConfig | None = None, server_args: ServerArgs | None = None) -> None:
        self.model_config = model_config or ModelConfig()
        self.server_args = server_args or ServerArgs()
        self.device = torch.device(self.server_args.device)
        self.attn_backend = create_backend(self.server_args)
        self.model = TinyTransformer(self.model_config, self.attn_backend, self.device)

    def new_cache(self, batch: int) -> KVCache:
        cfg = self.model_config
        return KVCache(
            cfg.num_layers, batch, cfg.num_heads, cfg.head_dim, cfg.max_seq_len,
            self.server_args.kv_cache_dtype, self.device,
            k_scale=cfg.kv_cache_scale, v_scale=cfg.kv_cache_scale,
        )

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache: KVCache, mode: ForwardMode) -> torch.Tensor:
        start = cache.length
        positions = torch.arange(start, start + input_ids.shape[1], device=self.device)
        fb = ForwardBatch(mode, input_ids.to(self.device), positions, cache, start)
        logits = self.model.forward(fb)
        cache.length = fb.end
        return logits

    def extend(self, input_ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        return self.forward(input_ids, cache, ForwardMode.EXTEND)

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        generator: torch.Generator,
        temperature: float = 1.0,
        cache: KVCache | None = None,
    ) -> GenerateOutput:
        """Sample ``max_new_tokens`` per row; ``cache`` may already hold a prefix."""
        cache = cache if cache is not None else self.new_cache(input_ids.shape[0])
        logits = self.extend(input_ids, cache)[:, -1]
        ids, logprobs = [], []
        for step in range(max_new_tokens):
            token, logprob = sample(logits, temperature, generator)
            ids.append(token)
            logprobs.append(logprob)
            if step + 1 < max_new_tokens:
                logits = self.forward(token[:, None], cache, ForwardMode.DECODE)[:, -1]
        return GenerateOutput(torch.stack(ids, 1), torch.stack(logprobs, 1), cache)

    @torch.inference_mode()
    def score(self, input_ids: torch.Tensor, start: int, temperature: float = 1.0) -> torch.Tensor:
        """Logprobs of input_ids[:, start:] from one cold prefill (no cache reuse)."""
        cache = self.new_cache(input_ids.shape[0])
        logits = self.extend(input_ids, cache)[:, start - 1 : -1].float() / temperature
        targets = input_ids[:, start:].to(logits.device)
        return torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0].cpu()


def sample(
    logits: torch.Tensor, temperature: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; the generator lives on the CPU so runs reproduce across devices."""
    logprobs = torch.log_softmax(logits.float() / temperature, -1).cpu()
    token = torch.multinomial(logprobs.exp(), 1, generator=generator)[:, 0]
    return token, logprobs.gather(-1, token[:, None])[:, 0]
