"""RWKV-6: gated linear attention whose output reads the state before the token's update,
plus a bonus ``u`` on the current token. Its kernels are GLA's (``kernels.gla.chunk``,
``kernels.gated_recurrent.fused_recurrent``) with the BONUS switch on."""
