"""delta_rule, gated_delta_rule and kda, fused-recurrent (one pass over time).

Keys are L2-normalised as callers normally do (docs/ops.md); ``use_qk_l2norm_in_kernel`` cases
also normalise inside the kernels. The backward replays the forward from state
checkpoints every 16 steps at these sizes, so T = 24 crosses a checkpoint boundary and
ends inside a chunk; the varlen packings (built around 16) put sequences at, just before
and just after a boundary. Gated ops run with grouped value heads (HV = 2 H). CPU sizes
are small because the interpreter runs every program of every check in turn; the
focused tests (tests/kernels/test_fused_recurrent_delta_pieces.py) split the value axis
over several programs. The ``wide_values`` cases split a value head of 512 (GatedDeltaNet's
default; K = 256 on the GPU) over sixteen programs, the plain delta rule's CPU case one of
392 over thirteen, the last one masked.
"""

from __future__ import annotations

from .common import DELTA_RULE_ERRORS, STATE, STATE_GVA, Arg, Case, linear_attention_spec

QK = {
    "q": Arg(("B", "T", "H", "K")),
    "k": Arg(("B", "T", "H", "K"), "unit"),
}
DELTA_ARGS = {
    **QK,
    "v": Arg(("B", "T", "H", "V")),
    "beta": Arg(("B", "T", "H"), "beta"),
    "initial_state": STATE,
}
GVA_ARGS = {**QK, "v": Arg(("B", "T", "HV", "V")), "beta": Arg(("B", "T", "HV"), "beta"), "initial_state": STATE_GVA}
GATED_ARGS = {**GVA_ARGS, "g": Arg(("B", "T", "HV"), "log_gate", float32=True)}
KDA_ARGS = {**GVA_ARGS, "g": Arg(("B", "T", "HV", "K"), "log_gate", float32=True)}

# CPU sizes: T = 24 spans two checkpoint chunks of 16, V = 24 is masked inside a 32-wide
# tile. The GVA cases map 2 value heads onto 1 key head (batch 2), and 4 onto 2 (batch 1).
SMALL = {"B": 2, "T": 24, "H": 2, "K": 16, "V": 24}
GVA = {**SMALL, "H": 1, "HV": 2}
GVA_HEADS = {**SMALL, "B": 1, "HV": 4}
# A head dim that is not a power of two: the key tile's lanes past K are masked, and the
# in-kernel l2norm must leave them out of its norm (a masked load filling them with
# anything but 0 is caught here, not at K = 16).
GVA_HEADS_ODD_K = {**GVA_HEADS, "K": 24}
GPU = {"B": 2, "T": 1024, "H": 4, "K": 128, "V": 128}
GPU_GVA = {**GPU, "HV": 8}
WITH_STATE = {"initial_state": True, "output_final_state": True}
L2NORM = {"use_qk_l2norm_in_kernel": True}
LARGE = {"B": 4, "T": 4096, "H": 16, "K": 128, "V": 128}
WIDE_V = {**SMALL, "B": 1, "H": 1, "V": 512}
GPU_WIDE_V = {**GPU_GVA, "K": 256, "V": 512}

DELTA_CASES = (
    Case("state", SMALL, options=WITH_STATE, gpu_dims=GPU),
    Case("l2norm", {**SMALL, "V": 16}, options=L2NORM, gpu_dims={**GPU, "K": 256, "V": 256}),
    Case("wide_values", {**WIDE_V, "V": 392}, options=WITH_STATE, gpu_dims={**GPU, "K": 256, "V": 512}),
)
GATED_CASES = (
    Case("gva_state", GVA, options=WITH_STATE, gpu_dims=GPU_GVA),
    Case("strong_decay_l2norm", GVA_HEADS_ODD_K, dist="strong_decay", options={**WITH_STATE, **L2NORM},
         gpu_dims={**GPU_GVA, "K": 256, "V": 256}),
    Case("realistic_large", SMALL, gpu_dims=LARGE, checks=("forward",)),
    Case("wide_values", WIDE_V, options={**WITH_STATE, **L2NORM}, gpu_dims=GPU_WIDE_V),
)
KDA_CASES = (
    Case("gva_state", GVA, options=WITH_STATE, gpu_dims=GPU_GVA),
    Case("strong_decay_l2norm", GVA_HEADS_ODD_K, dist="strong_decay", options={**WITH_STATE, **L2NORM},
         gpu_dims={**GPU_GVA, "K": 64, "V": 64}),
    Case("wide_values", WIDE_V, options=WITH_STATE, gpu_dims={**GPU_WIDE_V, "K": 128}),
)
COMPILE = (
    *(Case(f"d{d}", {"B": 1, "T": 128, "H": 2, "HV": 4, "K": d, "V": d}, options={**WITH_STATE, **L2NORM})
      for d in (128, 256)),
    Case("k256_v512", {"B": 1, "T": 128, "H": 2, "HV": 4, "K": 256, "V": 512}, options={**WITH_STATE, **L2NORM}),
)
DELTA_COMPILE = tuple(Case(c.name, {**c.dims, "HV": 2}, options=WITH_STATE) for c in COMPILE)

SPECS = [
    linear_attention_spec(
        "fused_recurrent_delta_rule", "delta_rule", DELTA_ARGS, DELTA_CASES,
        errors=DELTA_RULE_ERRORS,
        grads=("q", "k", "v", "beta", "initial_state"), compile_cases=DELTA_COMPILE,
    ),
    linear_attention_spec(
        "fused_recurrent_gated_delta_rule", "gated_delta_rule", GATED_ARGS, GATED_CASES,
        errors=DELTA_RULE_ERRORS,
        grads=("q", "k", "v", "g", "beta", "initial_state"), compile_cases=COMPILE,
    ),
    linear_attention_spec(
        "fused_recurrent_kda", "kda", KDA_ARGS, KDA_CASES,
        errors=DELTA_RULE_ERRORS,
        grads=("q", "k", "v", "g", "beta", "initial_state"), compile_cases=COMPILE,
    ),
]
