"""Name -> backend class registry, and resolution of (possibly hybrid) backends."""
from __future__ import annotations

from typing import Callable, TypeVar

from tinyserve.attention.base import AttentionBackend
from tinyserve.attention.hybrid import HybridAttnBackend
from tinyserve.config import ServerArgs
from tinyserve.forward_batch import ForwardMode

_BACKENDS: dict[str, type[AttentionBackend]] = {}

B = TypeVar("B", bound=type[AttentionBackend])


def register_backend(name: str) -> Callable[[B], B]:
    def wrap(cls: B) -> B:
        if name in _BACKENDS:
            raise ValueError(f"attention backend {name!r} registered twice")
        cls.name = name
        _BACKENDS[name] = cls
        return cls

    return wrap


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def get_backend_class(name: str) -> type[AttentionBackend]:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; available: {available_backends()}"
        ) from None


def create_backend(args: ServerArgs) -> AttentionBackend:
    if args.attention_backend == "hybrid":
        return HybridAttnBackend(
            get_backend_class(args.prefill_attention_backend)(),
            get_backend_class(args.decode_attention_backend)(),
        )
    return get_backend_class(args.attention_backend)()


def resolve_backend(backend: AttentionBackend, mode: ForwardMode) -> AttentionBackend:
    """The concrete backend that serves ``mode``; hybrid backends are unwrapped."""
    while isinstance(backend, HybridAttnBackend):
        backend = backend.prefill_backend if mode.is_extend() else backend.decode_backend
    return backend
