"""Triton kernels for linear attention and the modules around it (contract: OPS.md).

Every op validates its inputs before launching (``kernels._validate``), returns
``(o, final_state)`` for the recurrent families, and has its backward in Triton.
"""

from .conv import causal_conv1d
from .norm import l2norm, rms_norm, rms_norm_gated
from .rotary import RotaryEmbedding, apply_rotary, rotary_embedding
