"""Prefill hooks: per-backend transforms of Q/K/V before a prefill's attention."""
from __future__ import annotations

from typing import Callable

import torch

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
PrefillHook = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], QKV]

_PREFILL_HOOKS: dict[str, list[PrefillHook]] = {}


def register_prefill_hook(backend_name: str) -> Callable[[PrefillHook], PrefillHook]:
    def wrap(fn: PrefillHook) -> PrefillHook:
        _PREFILL_HOOKS.setdefault(backend_name, []).append(fn)
        return fn

    return wrap


def get_prefill_hooks(backend_name: str) -> list[PrefillHook]:
    return list(_PREFILL_HOOKS.get(backend_name, ()))


def apply_prefill_hooks(backend_name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> QKV:
    for hook in _PREFILL_HOOKS.get(backend_name, ()):
        q, k, v = hook(q, k, v)
    return q, k, v
