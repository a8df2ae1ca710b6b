"""rwkv6: the chunked and fused-recurrent kernels (``r, k, w [B, T, H, K]``, bonus ``u [H, K]``).

The output reads the state before the token's update; the chunked kernel is chunk_gla's
with the bonus switch, the fused one the gated recurrences' kernel with it, so the cases
are theirs: T past one chunk (64) and not a multiple of it, V not a power of two, K below
the smallest tile; the fused kernel's own cases keep T = 24 (past one 16-step segment of
its backward). ``tests/kernels/test_rwkv6_pieces.py`` checks the intra-chunk scores and
extreme decay.
"""

from __future__ import annotations

import dataclasses

from . import gla, simple_gla
from .common import HUGE_GRID_DIMS, SM80_AND_NEWER, STATE, Arg, linear_attention_errors, linear_attention_spec

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

WITH_STATE = {"initial_state": True, "output_final_state": True}
# gla's sizes (chunked) and fused gla's (T = 24), the realistic case with its backward too
CASES = tuple(dataclasses.replace(c, options=WITH_STATE, checks=("forward", "backward")) if c.name == "realistic_large"
              else c for c in gla.CASES)
# fused gla's cases, but K = 48 on "state": its 96 (token, head) rows take two bonus-dot
# programs of 64 rows (BR = 4096 / 64), the second with masked rows, where at K = 16 one
# program of 128 rows holds them all and a row mask one past n_rows cannot show
FUSED_CASES = tuple(c.with_dims(K=48) if c.name == "state" else c for c in simple_gla.GLA_CASES)
COMPILE = gla.COMPILE
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
