"""Attention backends. Importing this package registers the built-in ones."""
from tinyserve.attention import paged_fp8, torch_native  # noqa: F401  (registration)
from tinyserve.attention.base import AttentionBackend
from tinyserve.attention.hybrid import HybridAttnBackend
from tinyserve.attention.registry import create_backend, register_backend, resolve_backend

__all__ = [
    "AttentionBackend",
    "HybridAttnBackend",
    "create_backend",
    "register_backend",
    "resolve_backend",
]
