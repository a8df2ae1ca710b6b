"""Triton kernels for linear attention and the modules around it (contract: docs/ops.md).

Every op validates its inputs before launching (``kernels._validate``), returns
``(o, final_state)`` for the recurrent families, and has its backward in Triton.
"""

from .conv import causal_conv1d
from .delta_rule.chunk import chunk_delta_rule, chunk_gated_delta_rule  # noqa: E402
from .delta_rule.chunk_kda import chunk_kda  # noqa: E402
from .gated_recurrent.fused_recurrent import (  # noqa: E402
    fused_recurrent_gla, fused_recurrent_linear_attn, fused_recurrent_retention, fused_recurrent_simple_gla,
)
from .norm import l2norm, rms_norm, rms_norm_gated
from .rotary import RotaryEmbedding, apply_rotary, rotary_embedding
from .simple_gla.chunk import chunk_linear_attn, chunk_retention, chunk_simple_gla  # noqa: E402
from .gla.chunk import chunk_gla  # noqa: E402
from .delta_rule.fused_recurrent import fused_recurrent_delta_rule, fused_recurrent_gated_delta_rule, fused_recurrent_kda  # noqa: E402
from .dplr.fused_recurrent import fused_recurrent_dplr_delta_rule, fused_recurrent_rwkv7  # noqa: E402
from .attention import parallel_attn  # noqa: E402
from .hgrn.chunk import chunk_hgrn  # noqa: E402
from .hgrn.fused_recurrent import fused_recurrent_hgrn  # noqa: E402
from .rwkv6.ops import chunk_rwkv6, fused_recurrent_rwkv6  # noqa: E402
