"""Quantization helpers."""
