"""The fake ``sglang`` package (copied to ``python/sglang/__init__.py``)."""

__version__ = "0.0.1+fake"
