"""rwkv6: the chunked and fused-recurrent kernels (``r, k, w [B, T, H, K]``, bonus ``u [H, K]``).

The output reads the state before the token's update; the chunked kernel is chunk_gla's
with the bonus switch, the fused one the gated recurrences' kernel with it. CPU sizes as
gla's: T past one chunk (64) and not a multiple of it, V not a power of two, K below the
smallest tile; the fused kernel's own cases keep T = 24 (past one 16-step segment of its
backward). ``tests/kernels/test_rwkv6_pieces.py`` checks the intra-chunk scores and
extreme decay.
"""

from __future__ import annotations

from .common import HUGE_GRID_DIMS, SM80_AND_NEWER, STATE, Arg, Case, linear_attention_errors, linear_attention_spec

RWKV6_ARGS = {
    "r": Arg(("B", "T", "H", "K")),
    "k": Arg(("B", "T", "H", "K")),
    "v": Arg(("B", "T", "H", "V")),
    # float32 log decay as models keep it (see simple_gla's spec: an fp16 gate's gradient
    # under strong decay is subnormal)
    "w": Arg(("B", "T", "H", "K"), "log_gate", float32=True),
    "u": Arg(("H", "K")),
    "initial_state": STATE,
}

SMALL = {"B": 2, "T": 70, "H": 2, "K": 16, "V": 24}
GPU = {"B": 2, "T": 2048, "H": 8, "K": 128, "V": 128}
LARGE = {"B": 4, "T": 4096, "H": 16, "K": 128, "V": 128}
WITH_STATE = {"initial_state": True, "output_final_state": True}

CASES = (
    Case("state", SMALL, options=WITH_STATE, gpu_dims=GPU),
    Case("no_state", {**SMALL, "K": 8, "V": 8}, gpu_dims={**GPU, "K": 64, "V": 64}),
    Case("strong_decay", SMALL, dist="strong_decay", options=WITH_STATE, gpu_dims={**GPU, "T": 1024, "K": 256, "V": 256}),
    Case("wide", {"B": 1, "T": 70, "H": 2, "K": 48, "V": 40}, options=WITH_STATE,
         gpu_dims={**GPU, "K": 96, "V": 200}, checks=("forward", "backward")),
    Case("realistic_large", SMALL, options=WITH_STATE, gpu_dims=LARGE, checks=("forward", "backward")),
)
FUSED_CASES = (
    Case("state", {**SMALL, "T": 24}, options=WITH_STATE, gpu_dims=GPU),
    Case("no_state", {**SMALL, "T": 24, "H": 1, "K": 8, "V": 8}, gpu_dims={**GPU, "K": 64, "V": 64}),
    Case("strong_decay", {**SMALL, "T": 24, "H": 1}, dist="strong_decay", options=WITH_STATE,
         gpu_dims={**GPU, "K": 256, "V": 256}),
)
COMPILE = (
    Case("d128", {"B": 1, "T": 128, "H": 2, "K": 128, "V": 128}, options=WITH_STATE),
    Case("d256", {"B": 1, "T": 128, "H": 2, "K": 256, "V": 256}, options=WITH_STATE),
)
ERRORS = linear_attention_errors("r")

SPECS = [
    linear_attention_spec(
        "chunk_rwkv6", "rwkv6", RWKV6_ARGS, CASES, grads=("r", "k", "v", "w", "u", "initial_state"), chunk_size=64,
        agrees_with="fused_recurrent_rwkv6", compile_cases=COMPILE, min_arch=SM80_AND_NEWER, errors=ERRORS,
    ),
    linear_attention_spec(
        "fused_recurrent_rwkv6", "rwkv6", RWKV6_ARGS, FUSED_CASES, grads=("r", "k", "v", "w", "u", "initial_state"),
        compile_cases=COMPILE, huge_grid={**HUGE_GRID_DIMS, "T": 2}, errors=ERRORS,
    ),
]
