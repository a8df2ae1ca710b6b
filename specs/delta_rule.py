"""delta_rule, gated_delta_rule and kda, chunked.

Each is checked against its fused-recurrent form (``agrees_with``; those specs live in
``delta_rule_recurrent.py``).

Keys are L2-normalised as callers normally do (docs/ops.md); ``use_qk_l2norm_in_kernel`` cases
also normalise inside the kernels. The gated rules are checked with grouped value heads
(HV = 2 H, 4 H) and under strong decay (per-channel for kda). The ``wide_values`` cases
take value heads of 512 (GatedDeltaNet's defaults: head_dim 256, expand_v 2; K = 256 on
the GPU); the plain delta rule's CPU case takes V = 392, so that the last value block of
every kernel is masked.
"""

from __future__ import annotations

from .common import DELTA_RULE_ERRORS, SM80_AND_NEWER, STATE, STATE_GVA, Arg, Case, linear_attention_spec

DELTA_ARGS = {
    "q": Arg(("B", "T", "H", "K")),
    "k": Arg(("B", "T", "H", "K"), "unit"),
    "v": Arg(("B", "T", "H", "V")),
    "beta": Arg(("B", "T", "H"), "beta"),
    "initial_state": STATE,
}
KDA_ARGS = {
    "q": Arg(("B", "T", "H", "K")),
    "k": Arg(("B", "T", "H", "K"), "unit"),
    "v": Arg(("B", "T", "HV", "V")),
    "g": Arg(("B", "T", "HV", "K"), "log_gate", float32=True),
    "beta": Arg(("B", "T", "HV"), "beta"),
    "initial_state": STATE_GVA,
}
GATED_ARGS = {
    "q": Arg(("B", "T", "H", "K")),
    "k": Arg(("B", "T", "H", "K"), "unit"),
    "v": Arg(("B", "T", "HV", "V")),
    "g": Arg(("B", "T", "HV"), "log_gate"),
    "beta": Arg(("B", "T", "HV"), "beta"),
    "initial_state": STATE_GVA,
}

# CPU sizes: two chunks with a ragged second one (T = 80), V not a power of two; few heads,
# since the interpreter's time grows with the number of programs.
SMALL = {"B": 2, "T": 80, "H": 2, "K": 32, "V": 24}
GPU = {"B": 2, "T": 2048, "H": 8, "K": 128, "V": 128}
# wide value heads: one key head, two value heads on the CPU (the interpreter's time grows
# with the value blocks); GatedDeltaNet's default head dims on the GPU
WIDE_V = {"B": 1, "T": 80, "H": 1, "HV": 2, "K": 16, "V": 512}
GPU_WIDE_V = {"B": 2, "T": 2048, "H": 4, "HV": 8, "K": 256, "V": 512}
WITH_STATE = {"initial_state": True, "output_final_state": True}
L2NORM = {"use_qk_l2norm_in_kernel": True}

GATED_CASES = (
    Case("gva_state", {**SMALL, "H": 1, "HV": 2}, options=WITH_STATE, gpu_dims={**GPU, "HV": 16}),
    Case("strong_decay_l2norm", {**SMALL, "K": 16}, dist="strong_decay", options={**WITH_STATE, **L2NORM},
         gpu_dims={**GPU, "T": 1024, "K": 256, "V": 256}),
    Case("l2norm_gva", {**SMALL, "H": 1, "HV": 2, "K": 16, "V": 16}, options=L2NORM, gpu_dims={**GPU, "HV": 16}),
    Case("realistic_large", SMALL, gpu_dims={"B": 4, "T": 4096, "H": 16, "K": 128, "V": 128}, checks=("forward",)),
    Case("wide_values", WIDE_V, options={**WITH_STATE, **L2NORM}, gpu_dims=GPU_WIDE_V),
)
# kda: per-channel gates; strong decay is where the in-chunk matrices need the gate levels
KDA_CASES = (
    Case("gva_state", {**SMALL, "H": 1, "HV": 2}, options=WITH_STATE, gpu_dims={**GPU, "HV": 16}),
    # one sequence, two value heads: the agreement check steps the fused-recurrent kernel
    # through T in the interpreter, program by program
    Case("strong_decay_l2norm", {**SMALL, "B": 1, "H": 1, "HV": 2, "K": 16}, dist="strong_decay", options={**WITH_STATE, **L2NORM},
         gpu_dims={**GPU, "T": 1024, "HV": 16, "K": 256, "V": 256}),
    Case("wide_no_state", {"B": 1, "T": 70, "H": 2, "K": 48, "V": 40}, gpu_dims={**GPU, "K": 96, "V": 200},
         checks=("forward", "backward")),
    Case("realistic_large", SMALL, gpu_dims={"B": 4, "T": 4096, "H": 16, "K": 128, "V": 128}, checks=("forward",)),
    Case("wide_values", WIDE_V, options=WITH_STATE, gpu_dims={**GPU_WIDE_V, "K": 128}),
)
KDA_COMPILE = (
    *(Case(f"d{d}", {"B": 1, "T": 128, "H": 2, "HV": 4, "K": d, "V": d}, options={**WITH_STATE, **L2NORM})
      for d in (64, 128)),
    Case("k128_v512", {"B": 1, "T": 128, "H": 2, "HV": 4, "K": 128, "V": 512}, options={**WITH_STATE, **L2NORM}),
)
DELTA_CASES = (
    Case("state", SMALL, options=WITH_STATE, gpu_dims=GPU),
    Case("l2norm", {**SMALL, "K": 16, "V": 16}, options=L2NORM, gpu_dims={**GPU, "K": 64, "V": 64}),
    Case("wide_values", {**WIDE_V, "HV": 1, "V": 392}, options=WITH_STATE, gpu_dims={**GPU_WIDE_V, "HV": 4}),
)
COMPILE = (
    *(Case(f"d{d}", {"B": 1, "T": 128, "H": 2, "HV": 4, "K": d, "V": d}, options={**WITH_STATE, **L2NORM})
      for d in (128, 256)),
    Case("k256_v512", {"B": 1, "T": 128, "H": 2, "HV": 4, "K": 256, "V": 512}, options={**WITH_STATE, **L2NORM}),
)
# The delta rule runs the same kernels without the gate (never more shared memory): its
# benchmark size is enough.
DELTA_COMPILE = (Case("d128", {"B": 1, "T": 128, "H": 2, "K": 128, "V": 128}, options=WITH_STATE),)

SPECS = [
    linear_attention_spec(
        "chunk_kda", "kda", KDA_ARGS, KDA_CASES,
        errors=DELTA_RULE_ERRORS,
        grads=("q", "k", "v", "g", "beta", "initial_state"), chunk_size=64, compile_cases=KDA_COMPILE,
        agrees_with="fused_recurrent_kda", min_arch=SM80_AND_NEWER,
    ),
    linear_attention_spec(
        "chunk_gated_delta_rule", "gated_delta_rule", GATED_ARGS, GATED_CASES,
        errors=DELTA_RULE_ERRORS,
        grads=("q", "k", "v", "g", "beta", "initial_state"), chunk_size=64, compile_cases=COMPILE,
        agrees_with="fused_recurrent_gated_delta_rule", min_arch=SM80_AND_NEWER,
    ),
    linear_attention_spec(
        "chunk_delta_rule", "delta_rule", DELTA_ARGS, DELTA_CASES,
        errors=DELTA_RULE_ERRORS,
        grads=("q", "k", "v", "beta", "initial_state"), chunk_size=64, compile_cases=DELTA_COMPILE,
        agrees_with="fused_recurrent_delta_rule", min_arch=SM80_AND_NEWER,
    ),
]
