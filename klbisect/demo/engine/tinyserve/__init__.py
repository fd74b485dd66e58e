"""tinyserve: a tiny inference engine with a KV cache and pluggable attention."""
from tinyserve.version import __version__

__all__ = ["__version__"]
