"""simple_gla, retention, linear_attn and gla's fused-recurrent op (the worked example).

Each spec is the op's inputs (layouts and distributions), the cases the checks run over,
and which inputs have gradients; everything else comes from the generic checks.
"""

from __future__ import annotations

from .common import STATE, Arg, Case, linear_attention_spec

QKV = {
    "q": Arg(("B", "T", "H", "K")),
    "k": Arg(("B", "T", "H", "K")),
    "v": Arg(("B", "T", "H", "V")),
}
SIMPLE_GLA_ARGS = {
    **QKV,
    "g": Arg(("B", "T", "H"), "log_gate", optional=True),
    "g_gamma": Arg(("H",), "head_gate", optional=True, float32=True),
    "initial_state": STATE,
}
PLAIN_ARGS = {**QKV, "initial_state": STATE}
GLA_ARGS = {**QKV, "g": Arg(("B", "T", "H", "K"), "log_gate"), "initial_state": STATE}

# CPU sizes: T not a multiple of the chunk (64) and V not a power of two, so the masks on
# every edge are exercised; GPU sizes are the realistic ones.
SMALL = {"B": 2, "T": 80, "H": 2, "K": 32, "V": 24}
GPU = {"B": 2, "T": 2048, "H": 8, "K": 128, "V": 128}
WITH_STATE = {"initial_state": True, "output_final_state": True}

SIMPLE_GLA_CASES = (
    Case("g", SMALL, options={"g": True, **WITH_STATE}, gpu_dims=GPU),
    Case("g_gamma", SMALL, options={"g_gamma": True, **WITH_STATE}, gpu_dims=GPU),
    Case("no_gate", SMALL, gpu_dims={**GPU, "K": 64, "V": 64}),
    Case("strong_decay", SMALL, dist="strong_decay", options={"g": True, **WITH_STATE}, gpu_dims={**GPU, "K": 256, "V": 256}),
    Case("realistic_large", SMALL, options={"g": True}, gpu_dims={"B": 4, "T": 4096, "H": 16, "K": 128, "V": 128}, checks=("forward",)),
)
PLAIN_CASES = (
    Case("state", SMALL, options=WITH_STATE, gpu_dims=GPU),
    Case("no_state", {**SMALL, "K": 16, "V": 16}, gpu_dims={**GPU, "K": 64, "V": 64}),
)
COMPILE = (
    Case("d128", {"B": 1, "T": 128, "H": 2, "K": 128, "V": 128}, options={"g": True, **WITH_STATE}),
    Case("d256", {"B": 1, "T": 128, "H": 2, "K": 256, "V": 256}, options={"g": True, **WITH_STATE}),
)
PLAIN_COMPILE = tuple(Case(c.name, c.dims, options=WITH_STATE) for c in COMPILE)
# The fused-recurrent kernel walks T one step at a time: under the interpreter that costs
# ~1 s per 100 steps, so its CPU cases keep T short (still past one chunk of 64).
GLA_SMALL = {"B": 2, "T": 70, "H": 2, "K": 16, "V": 24}
GLA_CASES = (
    Case("state", GLA_SMALL, options=WITH_STATE, gpu_dims=GPU),
    Case("no_state", {**GLA_SMALL, "K": 8, "V": 8}, gpu_dims={**GPU, "K": 64, "V": 64}),
    Case("strong_decay", GLA_SMALL, dist="strong_decay", options=WITH_STATE, gpu_dims={**GPU, "K": 256, "V": 256}),
)

SPECS = [
    linear_attention_spec(
        "chunk_simple_gla", "simple_gla", SIMPLE_GLA_ARGS, SIMPLE_GLA_CASES,
        grads=("q", "k", "v", "g", "initial_state"), chunk_size=64,
        agrees_with="fused_recurrent_simple_gla", compile_cases=COMPILE,
    ),
    linear_attention_spec(
        "fused_recurrent_simple_gla", "simple_gla", SIMPLE_GLA_ARGS, SIMPLE_GLA_CASES,
        grads=("q", "k", "v", "g", "initial_state"), compile_cases=COMPILE,
    ),
    linear_attention_spec(
        "chunk_retention", "retention", PLAIN_ARGS, PLAIN_CASES,
        grads=("q", "k", "v", "initial_state"), chunk_size=64,
        agrees_with="fused_recurrent_retention", compile_cases=PLAIN_COMPILE,
    ),
    linear_attention_spec(
        "fused_recurrent_retention", "retention", PLAIN_ARGS, PLAIN_CASES,
        grads=("q", "k", "v", "initial_state"), compile_cases=PLAIN_COMPILE,
    ),
    linear_attention_spec(
        "chunk_linear_attn", "linear_attn", PLAIN_ARGS, PLAIN_CASES,
        grads=("q", "k", "v", "initial_state"), chunk_size=64,
        agrees_with="fused_recurrent_linear_attn", compile_cases=PLAIN_COMPILE,
    ),
    linear_attention_spec(
        "fused_recurrent_linear_attn", "linear_attn", PLAIN_ARGS, PLAIN_CASES,
        grads=("q", "k", "v", "initial_state"), compile_cases=PLAIN_COMPILE,
    ),
    linear_attention_spec(
        "fused_recurrent_gla", "gla", GLA_ARGS, GLA_CASES,
        grads=("q", "k", "v", "g", "initial_state"), compile_cases=COMPILE,
    ),
]
