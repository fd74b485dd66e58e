"""Hand-written commits of the demo history: the culprit and a series of neutral edits.

Every edit here is a plain text change of the engine's files, anchored on
exact snippets so that a drifting engine source fails loudly at generation
time instead of silently producing a different history. All edits except the
culprit leave the engine's numerics bit-identical; a few are decoys that
touch the files the culprit touches or the FP8 code it routes prefill through.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

Tree = dict[str, str]


class HistoryError(Exception):
    """The generator and the engine sources disagree (an anchor is missing)."""


@dataclass(frozen=True)
class Change:
    """One squash commit: a PR title (without ``(#N)``) and the edit it makes."""

    subject: str
    apply: Callable[[Tree], None]
    body: str = ""
    revertible: bool = False  # only docs-like changes that nothing later builds on


def replace_once(tree: Tree, path: str, old: str, new: str) -> None:
    text = tree.get(path)
    if text is None:
        raise HistoryError(f"{path}: file missing")
    count = text.count(old)
    if count != 1:
        raise HistoryError(f"{path}: anchor found {count} times: {old[:60]!r}")
    tree[path] = text.replace(old, new)


def append_text(tree: Tree, path: str, text: str, header: str = "") -> None:
    current = tree.get(path)
    if current is None:
        current = header
    if current and not current.endswith("\n"):
        current += "\n"
    tree[path] = current + text


def edits(*steps: Callable[[Tree], None]) -> Callable[[Tree], None]:
    def apply(tree: Tree) -> None:
        for step in steps:
            step(tree)

    return apply


def rep(path: str, old: str, new: str) -> Callable[[Tree], None]:
    return lambda tree: replace_once(tree, path, old, new)


def put(path: str, text: str) -> Callable[[Tree], None]:
    def apply(tree: Tree) -> None:
        if path in tree:
            raise HistoryError(f"{path}: already exists")
        tree[path] = text

    return apply


# --------------------------------------------------------------------------
# The culprit: resolve the attention backend once per model. Without a mode,
# resolution now unwraps the hybrid backend to its primary (decode) backend,
# so prefill looks up paged_fp8's prefill hooks and runs through FP8 Q/K/V.

CULPRIT = Change(
    subject="Resolve attention backend once at model init",
    body=(
        "Resolving the hybrid backend per layer and per step shows up in decode\n"
        "profiles. Resolve it once when the model is built. `resolve_backend`\n"
        "without a mode returns the hybrid's primary backend, which owns the KV\n"
        "cache layout.\n"
    ),
    apply=edits(
        rep(
            "tinyserve/attention/registry.py",
            '''def resolve_backend(backend: AttentionBackend, mode: ForwardMode) -> AttentionBackend:
    """The concrete backend that serves ``mode``; hybrid backends are unwrapped."""
    while isinstance(backend, HybridAttnBackend):
        backend = backend.prefill_backend if mode.is_extend() else backend.decode_backend
    return backend
''',
            '''def resolve_backend(
    backend: AttentionBackend, mode: ForwardMode | None = None
) -> AttentionBackend:
    """The concrete backend behind ``backend``.

    Hybrid backends are unwrapped to the backend serving ``mode`` or, without
    a mode, to their primary backend, which owns the KV cache layout.
    """
    while isinstance(backend, HybridAttnBackend):
        if mode is None:
            backend = backend.primary
        else:
            backend = backend.prefill_backend if mode.is_extend() else backend.decode_backend
    return backend
''',
        ),
        rep(
            "tinyserve/model.py",
            "        self.attn_backend = attn_backend\n",
            "        self.attn_backend = attn_backend\n"
            "        # Resolved once here: resolving per layer and per step is measurable in decode.\n"
            "        self.hook_backend = resolve_backend(attn_backend)\n",
        ),
        rep(
            "tinyserve/model.py",
            """        impl = resolve_backend(self.attn_backend, fb.mode)
        if fb.mode.is_extend():
            q, k, v = apply_prefill_hooks(impl.name, q, k, v)
        out = impl.forward(layer, q, k, v, fb)
""",
            """        if fb.mode.is_extend():
            q, k, v = apply_prefill_hooks(self.hook_backend.name, q, k, v)
        out = self.attn_backend.forward(layer, q, k, v, fb)
""",
        ),
    ),
)


# --------------------------------------------------------------------------
# Neutral hand-written edits, applied in this order at seed-chosen positions.

_NORM = '''"""Normalization layers."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)
'''

_ROPE_FUNCS = '''def rope_tables(config: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, heads, tokens, head_dim]; cos/sin: [tokens, head_dim/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
'''

_ROTARY = '''"""Rotary position embeddings."""
from __future__ import annotations

import torch

from tinyserve.config import ModelConfig


''' + _ROPE_FUNCS

_MODEL_HELPERS = '''def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)


''' + _ROPE_FUNCS + '''

'''

STORY: list[Change] = [
    Change(
        subject="Refactor attention registry lookup",
        apply=rep(
            "tinyserve/attention/registry.py",
            """    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; available: {available_backends()}"
        ) from None
""",
            """    cls = _BACKENDS.get(name)
    if cls is None:
        raise ValueError(f"unknown attention backend {name!r}; available: {available_backends()}")
    return cls
""",
        ),
    ),
    Change(
        subject="Add ForwardMode.is_prefill alias",
        apply=rep(
            "tinyserve/forward_batch.py",
            """    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE
""",
            """    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_prefill(self) -> bool:
        \"\"\"Alias of is_extend, for code ported from engines that say prefill.\"\"\"
        return self.is_extend()
""",
        ),
    ),
    Change(
        subject="Move rms_norm and RoPE helpers into tinyserve.layers",
        body="No functional change; the model module only keeps the model.\n",
        apply=edits(
            put("tinyserve/layers/__init__.py", '"""Building blocks shared by models."""\n'),
            put("tinyserve/layers/norm.py", _NORM),
            put("tinyserve/layers/rotary.py", _ROTARY),
            rep("tinyserve/model.py", _MODEL_HELPERS, ""),
            rep(
                "tinyserve/model.py",
                "from tinyserve.hooks import apply_prefill_hooks\n",
                "from tinyserve.hooks import apply_prefill_hooks\n"
                "from tinyserve.layers.norm import rms_norm\n"
                "from tinyserve.layers.rotary import apply_rope, rope_tables\n",
            ),
        ),
    ),
    Change(
        subject="Fuse clamp and cast in FP8 quantization",
        apply=edits(
            rep(
                "tinyserve/quant/fp8.py",
                """    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale
""",
                """    q = torch.clamp(x / scale, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale
""",
            ),
            rep(
                "tinyserve/quant/fp8.py",
                """    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.to(x.dtype) * scale
""",
                """    q = torch.clamp(x / scale, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.to(x.dtype) * scale
""",
            ),
        ),
    ),
    Change(
        subject="Add unregister_prefill_hook for tests",
        apply=lambda tree: append_text(
            tree,
            "tinyserve/hooks.py",
            '''

def unregister_prefill_hook(backend_name: str, fn: PrefillHook) -> None:
    """Remove a hook registered with register_prefill_hook (tests use this)."""
    hooks = _PREFILL_HOOKS.get(backend_name, [])
    if fn in hooks:
        hooks.remove(fn)
''',
        ),
    ),
    Change(
        subject="Refactor hybrid backend dispatch",
        apply=edits(
            rep(
                "tinyserve/attention/hybrid.py",
                "from tinyserve.forward_batch import ForwardBatch\n",
                "from tinyserve.forward_batch import ForwardBatch, ForwardMode\n",
            ),
            rep(
                "tinyserve/attention/hybrid.py",
                """        impl = self.prefill_backend if fb.mode.is_extend() else self.decode_backend
        return impl.forward(layer, q, k, v, fb)
""",
                """        return self.backend_for(fb.mode).forward(layer, q, k, v, fb)

    def backend_for(self, mode: ForwardMode) -> AttentionBackend:
        return self.prefill_backend if mode.is_extend() else self.decode_backend
""",
            ),
        ),
    ),
    Change(
        subject="Add KVCache.nbytes for memory accounting",
        apply=rep(
            "tinyserve/kv_cache.py",
            """    @property
    def batch(self) -> int:
        return self.kv[0].shape[1]
""",
            """    @property
    def batch(self) -> int:
        return self.kv[0].shape[1]

    @property
    def nbytes(self) -> int:
        \"\"\"Bytes the cache would take in its storage dtype.\"\"\"
        per_value = {"auto": 4, "bf16": 2, "fp8_e4m3": 1}[self.dtype]
        return sum(t.numel() for t in self.kv) * per_value
""",
        ),
    ),
    Change(
        subject="Add per-token FP8 quantization helper",
        apply=lambda tree: append_text(
            tree,
            "tinyserve/quant/fp8.py",
            '''

def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize with one scale per row of the last dimension."""
    amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    scale = amax.float() / FP8_MAX
    q = torch.clamp(x / scale, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale
''',
        ),
    ),
    Change(
        subject="Log the attention backend at engine start",
        apply=edits(
            rep(
                "tinyserve/engine.py",
                "from dataclasses import dataclass\n",
                "import logging\nfrom dataclasses import dataclass\n",
            ),
            rep(
                "tinyserve/engine.py",
                "from tinyserve.model import TinyTransformer\n",
                "from tinyserve.model import TinyTransformer\n\nlogger = logging.getLogger(__name__)\n",
            ),
            rep(
                "tinyserve/engine.py",
                "        self.model = TinyTransformer(self.model_config, self.attn_backend, self.device)\n",
                "        self.model = TinyTransformer(self.model_config, self.attn_backend, self.device)\n"
                '        logger.info("attention backend: %r", self.attn_backend)\n',
            ),
        ),
    ),
    Change(
        subject="Validate kv_cache_dtype in ServerArgs",
        apply=edits(
            rep(
                "tinyserve/config.py",
                "@dataclass(frozen=True)\nclass ServerArgs:\n",
                'KV_CACHE_DTYPES = ("auto", "bf16", "fp8_e4m3")\n\n\n@dataclass(frozen=True)\nclass ServerArgs:\n',
            ),
            # ServerArgs is the last class in config.py, so appending ends its body.
            lambda tree: append_text(
                tree,
                "tinyserve/config.py",
                """
    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}")
""",
            ),
        ),
    ),
    Change(
        subject="Build the causal mask with triu",
        body="Same mask, one kernel instead of two aranges and a compare.\n",
        apply=rep(
            "tinyserve/attention/base.py",
            """    if t > 1:
        qpos = torch.arange(start, start + t, device=q.device)[:, None]
        kpos = torch.arange(s, device=q.device)[None, :]
        scores = scores.masked_fill(kpos > qpos, float("-inf"))
""",
            """    if t > 1:
        # Key j is in the future of query i (at position start + i) when j > start + i.
        future = torch.ones(t, s, dtype=torch.bool, device=q.device).triu(start + 1)
        scores = scores.masked_fill(future, float("-inf"))
""",
        ),
    ),
    Change(
        subject="Add optional top-k to sample()",
        apply=edits(
            rep(
                "tinyserve/engine.py",
                """def sample(
    logits: torch.Tensor, temperature: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:""",
                """def sample(
    logits: torch.Tensor,
    temperature: float,
    generator: torch.Generator,
    top_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:""",
            ),
            rep(
                "tinyserve/engine.py",
                "    logprobs = torch.log_softmax(logits.float() / temperature, -1).cpu()\n",
                "    logits = logits.float()\n"
                "    if top_k is not None:\n"
                "        kth = logits.topk(top_k, dim=-1).values[..., -1:]\n"
                '        logits = logits.masked_fill(logits < kth, float("-inf"))\n'
                "    logprobs = torch.log_softmax(logits / temperature, -1).cpu()\n",
            ),
        ),
    ),
    Change(
        subject="Document the torch_native backend",
        apply=rep(
            "tinyserve/attention/torch_native.py",
            """class TorchNativeBackend(AttentionBackend):
""",
            """class TorchNativeBackend(AttentionBackend):
    \"\"\"Plain torch attention; new tokens attend to fresh K/V, the prefix to the cache.\"\"\"

""",
        ),
    ),
    Change(
        subject="List registered prefill hooks",
        apply=lambda tree: append_text(
            tree,
            "tinyserve/hooks.py",
            '''

def registered_prefill_hooks() -> dict[str, list[str]]:
    """Backend name -> names of its prefill hooks, for debugging and docs."""
    return {name: [fn.__name__ for fn in fns] for name, fns in sorted(_PREFILL_HOOKS.items())}
''',
        ),
    ),
]
