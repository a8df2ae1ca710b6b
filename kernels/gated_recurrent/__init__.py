"""The gated linear recurrences (linear_attn, simple_gla, retention, gla): shared argument
checks and the fused-recurrent kernels."""
