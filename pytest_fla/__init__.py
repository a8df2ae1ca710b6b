"""pytest-fla: correctness and sanitizer testing for linear-attention GPU kernels (a pytest plugin)."""
