"""hgrn: the elementwise gated recurrence, chunked (a parallel scan) and fused-recurrent.

HGRN has no heads: x, g ``[B, T, D]``, state ``[N, D]``. Its kernels put (chunk or
sequence) x channel block on grid axis 0, so the huge-grid sizes make
``B * cdiv(D, 128)`` pass 65535 (whatever the channel block, up to 128). CPU sizes: T
past two chunks of 64 (and several 32-token tiles of the fused kernel) ending inside
one, D not a power of two and over several channel blocks; GPU sizes the realistic ones.
"""

from __future__ import annotations

from .common import Arg, Case, linear_attention_errors, linear_attention_spec

HGRN_ARGS = {
    "x": Arg(("B", "T", "D")),
    "g": Arg(("B", "T", "D"), "log_gate"),
    "initial_state": Arg(("N", "D"), "state", optional=True),
}
SMALL = {"B": 2, "T": 150, "D": 100}
GPU = {"B": 4, "T": 4096, "D": 2048}
WITH_STATE = {"initial_state": True, "output_final_state": True}

CASES = (
    Case("state", SMALL, options=WITH_STATE, gpu_dims=GPU),
    Case("no_state", {**SMALL, "T": 70, "D": 40}, gpu_dims={**GPU, "D": 1000}),
    Case("strong_decay", SMALL, dist="strong_decay", options=WITH_STATE, gpu_dims=GPU),
    Case("wide", {"B": 1, "T": 65, "D": 300}, options=WITH_STATE, gpu_dims={**GPU, "B": 2, "D": 4100}),
)
COMPILE = (
    Case("d2048", {"B": 1, "T": 256, "D": 2048}, options=WITH_STATE),
    Case("d4100", {"B": 1, "T": 128, "D": 4100}, options=WITH_STATE),
)
# B * cdiv(2048, 128) = 4097 * 16 = 65552 programs on axis 0, past 65535 at any block up to 128
HUGE_GRID = {"B": 4097, "T": 16, "D": 2048}
# a sample of 2 rows the 64-bit-offset check tiles past 2**31 elements
INT64_DIMS = {"B": 2, "T": 64, "D": 512}
# no heads, no scale; the channel dim D is the width
ERRORS = linear_attention_errors("x", head_dim=None, heads={}, scale=False, widths={"D": "x"})

SPECS = [
    linear_attention_spec(
        "chunk_hgrn", "hgrn", HGRN_ARGS, CASES, grads=("x", "g", "initial_state"), chunk_size=64,
        agrees_with="fused_recurrent_hgrn", compile_cases=COMPILE, huge_grid=HUGE_GRID, int64_dims=INT64_DIMS,
        errors=ERRORS,
    ),
    linear_attention_spec(
        "fused_recurrent_hgrn", "hgrn", HGRN_ARGS, CASES, grads=("x", "g", "initial_state"),
        compile_cases=COMPILE, huge_grid=HUGE_GRID, int64_dims=INT64_DIMS, errors=ERRORS,
    ),
]
