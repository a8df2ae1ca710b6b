"""Delta-rule family: chunked (``chunk.py``) and fused-recurrent (``fused_recurrent.py``) forms."""
from .fused_recurrent import fused_recurrent_delta_rule, fused_recurrent_gated_delta_rule, fused_recurrent_kda
