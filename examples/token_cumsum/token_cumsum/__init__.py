"""An example kernel package for pytest-fla: one Triton op, its float64 reference
(``token_cumsum.reference``), checked by the plugin through its spec in
``examples/token_cumsum/tests/conftest.py``."""

from .op import token_cumsum

__all__ = ["token_cumsum"]
