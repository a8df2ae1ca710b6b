"""gla: the chunked kernel (per-channel gates ``g [B, T, H, K]``).

The generic checks come from this description; ``tests/kernels/test_gla_pieces.py`` checks
the kernel's pieces (intra-chunk scores, per-chunk states) and the extreme-decay stress.
"""

from __future__ import annotations

from .common import SM80_AND_NEWER, STATE, Arg, Case, linear_attention_spec

GLA_ARGS = {
    "q": Arg(("B", "T", "H", "K")),
    "k": Arg(("B", "T", "H", "K")),
    "v": Arg(("B", "T", "H", "V")),
    "g": Arg(("B", "T", "H", "K"), "log_gate"),
    "initial_state": STATE,
}

# CPU sizes: T past one chunk (64) and not a multiple of it, V not a power of two, K = 8
# below the smallest tile, so the masks on every edge are exercised. They stay small
# because the agreement check runs the fused-recurrent kernel step by step in the
# interpreter; "wide" (K, V not powers of two, K past 32, an odd head count: a sequence
# index taken from a neighbouring head, i_nh ^ 1, stays in its sequence at even H) is
# checked against the reference only. GPU sizes are the realistic ones.
SMALL = {"B": 2, "T": 70, "H": 2, "K": 16, "V": 24}
GPU = {"B": 2, "T": 2048, "H": 8, "K": 128, "V": 128}
WITH_STATE = {"initial_state": True, "output_final_state": True}

CASES = (
    Case("state", SMALL, options=WITH_STATE, gpu_dims=GPU),
    Case("no_state", {**SMALL, "K": 8, "V": 8}, gpu_dims={**GPU, "K": 64, "V": 64}),
    Case("strong_decay", SMALL, dist="strong_decay", options=WITH_STATE, gpu_dims={**GPU, "T": 1024, "K": 256, "V": 256}),
    Case("wide", {"B": 1, "T": 70, "H": 3, "K": 48, "V": 40}, options=WITH_STATE,
         gpu_dims={**GPU, "K": 96, "V": 200}, checks=("forward", "backward")),
    Case("realistic_large", SMALL, gpu_dims={"B": 4, "T": 4096, "H": 16, "K": 128, "V": 128}, checks=("forward",)),
)
COMPILE = (
    Case("d128", {"B": 1, "T": 128, "H": 2, "K": 128, "V": 128}, options=WITH_STATE),
    Case("d256", {"B": 1, "T": 128, "H": 2, "K": 256, "V": 256}, options=WITH_STATE),
)

SPECS = [
    linear_attention_spec(
        "chunk_gla", "gla", GLA_ARGS, CASES,
        grads=("q", "k", "v", "g", "initial_state"), chunk_size=64,
        agrees_with="fused_recurrent_gla", compile_cases=COMPILE, min_arch=SM80_AND_NEWER,
    ),
]
