"""Softmax attention (flash style): ``parallel_attn``."""

from .parallel import parallel_attn

__all__ = ["parallel_attn"]
