"""dplr_delta_rule and rwkv7, chunked and fused-recurrent.

Inputs as docs/ops.md draws them for RWKV-7: ``kk`` a unit vector, ``a = -kk``,
``b = kk * sigmoid(randn)``, the log decay ``w = -e^{-1/2} sigmoid(randn)``; the DPLR
cases take the generic ``logsigmoid(randn) / 8`` gate for ``gk`` instead. ``strong_decay``
cases scale the gates 100x and more (RWKV-7: 800x, about -490 per step), where a chunked
form that exponentiates a positive gate difference overflows. Gates are float32 (as
callers keep them): their gradients under strong decay, ``e^{gk}`` times O(1), fall
below fp16's range, where an fp16 gradient can only read 0.

The fused-recurrent backward replays from state checkpoints every 16 steps at the CPU
sizes, so T = 24 crosses a boundary. The chunked kernels' pieces get focused tests of
their own in ``tests/kernels/``.
"""

from __future__ import annotations

import dataclasses

from .common import SM80_AND_NEWER, STATE, Arg, Case, linear_attention_errors, linear_attention_spec

# a = -kk, b = kk * sigmoid(randn) with kk a unit vector: the rank-one term b a^T is
# -sigmoid * kk kk^T, a delta-rule-like erase along kk
A = Arg(("B", "T", "H", "K"), "unit", scale=-1.0)
B_ = Arg(("B", "T", "H", "K"), "beta", times="a", scale=-1.0)
DPLR_ARGS = {
    "q": Arg(("B", "T", "H", "K")),
    "k": Arg(("B", "T", "H", "K")),
    "v": Arg(("B", "T", "H", "V")),
    "a": A,
    "b": B_,
    "gk": Arg(("B", "T", "H", "K"), "log_gate", float32=True),
    "initial_state": STATE,
}
RWKV7_ARGS = {
    "r": Arg(("B", "T", "H", "K")),
    "w": Arg(("B", "T", "H", "K"), "rwkv_decay", float32=True),
    "k": Arg(("B", "T", "H", "K")),
    "v": Arg(("B", "T", "H", "V")),
    "a": A,
    "b": B_,
    "initial_state": STATE,
}

WITH_STATE = {"initial_state": True, "output_final_state": True}
GPU = {"B": 2, "T": 2048, "H": 8, "K": 128, "V": 128}
LARGE = {"B": 4, "T": 4096, "H": 16, "K": 128, "V": 128}
TINY = {"B": 1, "T": 16, "H": 1, "K": 16, "V": 16}

# CPU sizes: T = 24 spans two checkpoint segments of 16, V = 24 is masked inside a tile
RECURRENT_SMALL = {"B": 2, "T": 24, "H": 2, "K": 16, "V": 24}
RECURRENT_CASES = (
    Case("state", RECURRENT_SMALL, options=WITH_STATE, gpu_dims=GPU),
    # K = 24: the key tile's lanes past K are masked too
    Case("strong_decay", {**RECURRENT_SMALL, "B": 1, "K": 24}, dist="strong_decay", options=WITH_STATE,
         gpu_dims={**GPU, "K": 64, "V": 64}),
    Case("realistic_large", TINY, gpu_dims=LARGE, checks=("forward",)),
)
COMPILE = tuple(
    Case(f"d{d}", {"B": 1, "T": 128, "H": 2, "K": d, "V": d}, options=WITH_STATE) for d in (64, 128)
) + (Case("k96_v120", {"B": 1, "T": 128, "H": 2, "K": 96, "V": 120}, options=WITH_STATE),)  # the wide case's GPU sizes
# CPU sizes for the chunked kernels: two chunks with a ragged second one (T = 80), V not a
# power of two, K = 32 (one key block of the level kernels). One head in the first case
# (the varlen packings run it once per sequence, and the interpreter's time grows with the
# programs); two heads in the others.
CHUNK_SMALL = {"B": 1, "T": 80, "H": 1, "K": 32, "V": 24}
CHUNK_CASES = (
    Case("state", CHUNK_SMALL, options=WITH_STATE, gpu_dims=GPU),
    Case("strong_decay", {**CHUNK_SMALL, "H": 2}, dist="strong_decay", options=WITH_STATE,
         gpu_dims={**GPU, "T": 1024, "K": 64, "V": 64}),
    Case("wide", {"B": 1, "T": 70, "H": 2, "K": 48, "V": 40}, options=WITH_STATE,
         gpu_dims={**GPU, "K": 96, "V": 120}, checks=("forward", "backward")),  # V <= 128: the kernels' range
    # the sizes models train at, forward and backward, on the GPU (tiny on the CPU)
    Case("realistic_large", TINY, gpu_dims=LARGE, checks=("forward", "backward")),
    Case("realistic_large_d64", TINY, gpu_dims={**LARGE, "K": 64, "V": 64}, checks=("forward", "backward")),
)
RECURRENT_GRADS = ("q", "k", "v", "a", "b", "gk", "initial_state")
RWKV7_GRADS = ("r", "w", "k", "v", "a", "b", "initial_state")


def rwkv7_spec(name, cases, **fields):
    """rwkv7's arguments are named r, w: its error inputs are anchored on r."""
    spec = linear_attention_spec(name, "rwkv7", RWKV7_ARGS, cases, grads=RWKV7_GRADS, **fields)
    return dataclasses.replace(spec, errors=linear_attention_errors(anchor="r"))


SPECS = [
    linear_attention_spec(
        "chunk_dplr_delta_rule", "dplr_delta_rule", DPLR_ARGS, CHUNK_CASES, grads=RECURRENT_GRADS,
        chunk_size=64, agrees_with="fused_recurrent_dplr_delta_rule", compile_cases=COMPILE, min_arch=SM80_AND_NEWER,
    ),
    rwkv7_spec(
        "chunk_rwkv7", CHUNK_CASES, chunk_size=64, agrees_with="fused_recurrent_rwkv7", compile_cases=COMPILE,
        min_arch=SM80_AND_NEWER,
    ),
    linear_attention_spec(
        "fused_recurrent_dplr_delta_rule", "dplr_delta_rule", DPLR_ARGS, RECURRENT_CASES,
        grads=RECURRENT_GRADS, compile_cases=COMPILE,
    ),
    rwkv7_spec(
        "fused_recurrent_rwkv7", RECURRENT_CASES, compile_cases=COMPILE,
    ),
]
