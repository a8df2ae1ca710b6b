"""Triton kernels for linear attention and the modules around it (contract: OPS.md).

Every op validates its inputs before launching (``kernels._validate``), returns
``(o, final_state)`` for the recurrent families, and has its backward in Triton.
"""

from .gla.chunk import chunk_gla  # noqa: E402
