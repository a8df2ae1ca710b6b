"""pytest-fla: correctness and sanitizer testing for linear-attention GPU kernels."""

__version__ = "0.1.0"
