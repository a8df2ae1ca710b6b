"""HGRN: the elementwise gated recurrence ``h_t = e^{g_t} h_{t-1} + x_t`` (no heads),
chunked (a parallel scan) and fused-recurrent (one pass over T)."""
