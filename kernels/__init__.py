"""Triton kernels for linear attention and the modules around it (contract: OPS.md).

Every op validates its inputs before launching (``kernels._validate``), returns
``(o, final_state)`` for the recurrent families, and has its backward in Triton.
"""
from .delta_rule.chunk import chunk_delta_rule, chunk_gated_delta_rule
