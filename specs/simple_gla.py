"""simple_gla, retention, linear_attn and gla's fused-recurrent op (the worked example).

Each spec is the op's inputs (layouts and distributions), the cases the checks run over,
and which inputs have gradients; everything else comes from the generic checks.
"""

from __future__ import annotations

from .common import HUGE_GRID_DIMS, STATE, Arg, Case, linear_attention_spec

QKV = {
    "q": Arg(("B", "T", "H", "K")),
    "k": Arg(("B", "T", "H", "K")),
    "v": Arg(("B", "T", "H", "V")),
}
SIMPLE_GLA_ARGS = {
    **QKV,
    # Gates in float32 (as models keep them): under strong decay every dg is below fp16's
    # normal range (~1e-6 against 6e-5), so an fp16 gate's gradient is a subnormal with
    # one or two significant digits and the relative check would measure fp16, not the kernel.
    "g": Arg(("B", "T", "H"), "log_gate", optional=True, float32=True),
    "g_gamma": Arg(("H",), "head_gate", optional=True, float32=True),
    "initial_state": STATE,
}
PLAIN_ARGS = {**QKV, "initial_state": STATE}
GLA_ARGS = {**QKV, "g": Arg(("B", "T", "H", "K"), "log_gate", float32=True), "initial_state": STATE}

# CPU sizes: T not a multiple of the chunk (64) and V not a power of two, so the masks on
# every edge are exercised; GPU sizes are the realistic ones.
SMALL = {"B": 2, "T": 80, "H": 2, "K": 32, "V": 24}
GPU = {"B": 2, "T": 2048, "H": 8, "K": 128, "V": 128}
WITH_STATE = {"initial_state": True, "output_final_state": True}

# Agreement with the fused-recurrent kernel (which the interpreter runs step by step, ~20 s
# a call at these sizes) runs on one case per pair: strong decay here; the constant and
# absent gates are compared through retention and linear_attn.
NO_AGREEMENT = ("forward", "backward")
SIMPLE_GLA_CASES = (
    Case("g", SMALL, options={"g": True, **WITH_STATE}, gpu_dims=GPU, checks=NO_AGREEMENT),
    Case("g_gamma", SMALL, options={"g_gamma": True, **WITH_STATE}, gpu_dims=GPU, checks=NO_AGREEMENT),
    Case("no_gate", SMALL, gpu_dims={**GPU, "K": 64, "V": 64}, checks=NO_AGREEMENT),
    Case("strong_decay", SMALL, dist="strong_decay", options={"g": True, **WITH_STATE}, gpu_dims={**GPU, "K": 256, "V": 256}),
    Case("realistic_large", SMALL, options={"g": True}, gpu_dims={"B": 4, "T": 4096, "H": 16, "K": 128, "V": 128}, checks=("forward",)),
)
PLAIN_CASES = (
    Case("state", SMALL, options=WITH_STATE, gpu_dims=GPU),
    # K = 24 in a 32-wide tile, V = 32: a state mask built over the wrong axis passes
    # where K fills its tile, and does not trace where the two tiles differ
    Case("no_state", {**SMALL, "K": 24, "V": 32}, gpu_dims={**GPU, "K": 64, "V": 64}, checks=NO_AGREEMENT),
)
COMPILE = (
    Case("d128", {"B": 1, "T": 128, "H": 2, "K": 128, "V": 128}, options={"g": True, **WITH_STATE}),
    Case("d256", {"B": 1, "T": 128, "H": 2, "K": 256, "V": 256}, options={"g": True, **WITH_STATE}),
)
PLAIN_COMPILE = tuple(Case(c.name, c.dims, options=WITH_STATE) for c in COMPILE)
# The fused-recurrent kernels walk T one step at a time, ~20 interpreted ops a step at
# ~1 ms each: their own CPU cases keep T = 24 (past one 16-step segment of the backward,
# with a partial one after it); the chunk specs' agreement checks still run them at T = 80.
FUSED_SMALL = {"T": 24}


def fused_cases(cases):
    """The chunk cases at the fused kernels' CPU length, and one head, but for the last
    case: one sequence of three heads there, so each fused op's own checks see a head
    index taken from the wrong head (at an even head count ``(i_nh ^ 1) % H`` only swaps
    which program runs which head, the same result)."""
    *rest, last = cases
    return (*(c.with_dims(**FUSED_SMALL, H=1) for c in rest), last.with_dims(**FUSED_SMALL, B=1, H=3))


GLA_CASES = (
    Case("state", {**SMALL, **FUSED_SMALL, "K": 16}, options=WITH_STATE, gpu_dims=GPU),
    Case("no_state", {**SMALL, **FUSED_SMALL, "K": 8, "V": 8}, gpu_dims={**GPU, "K": 64, "V": 64}),
    Case("strong_decay", {**SMALL, **FUSED_SMALL, "K": 16}, dist="strong_decay", options=WITH_STATE,
         gpu_dims={**GPU, "K": 256, "V": 256}),
)
# The huge-grid check needs B * H past 65535, not length: two steps do. The four fused ops
# launch through the same code (one kernel pair, gate switches), so the grid checks (huge
# grid, 64-bit offsets) run once, on fused_recurrent_gla: under the interpreter each
# huge-grid run takes ~40 s.
FUSED_HUGE_GRID = {**HUGE_GRID_DIMS, "T": 2}

SPECS = [
    linear_attention_spec(
        "chunk_simple_gla", "simple_gla", SIMPLE_GLA_ARGS, SIMPLE_GLA_CASES,
        grads=("q", "k", "v", "g", "initial_state"), chunk_size=64,
        agrees_with="fused_recurrent_simple_gla", compile_cases=COMPILE,
    ),
    linear_attention_spec(
        "fused_recurrent_simple_gla", "simple_gla", SIMPLE_GLA_ARGS, fused_cases(SIMPLE_GLA_CASES),
        grads=("q", "k", "v", "g", "initial_state"), compile_cases=COMPILE, huge_grid=None, int64_dims=None,
    ),
    linear_attention_spec(
        "chunk_retention", "retention", PLAIN_ARGS, PLAIN_CASES,
        grads=("q", "k", "v", "initial_state"), chunk_size=64,
        agrees_with="fused_recurrent_retention", compile_cases=PLAIN_COMPILE,
    ),
    linear_attention_spec(
        "fused_recurrent_retention", "retention", PLAIN_ARGS, fused_cases(PLAIN_CASES),
        grads=("q", "k", "v", "initial_state"), compile_cases=PLAIN_COMPILE, huge_grid=None, int64_dims=None,
    ),
    linear_attention_spec(
        "chunk_linear_attn", "linear_attn", PLAIN_ARGS, PLAIN_CASES,
        grads=("q", "k", "v", "initial_state"), chunk_size=64,
        agrees_with="fused_recurrent_linear_attn", compile_cases=PLAIN_COMPILE,
    ),
    linear_attention_spec(
        "fused_recurrent_linear_attn", "linear_attn", PLAIN_ARGS, fused_cases(PLAIN_CASES),
        grads=("q", "k", "v", "initial_state"), compile_cases=PLAIN_COMPILE, huge_grid=None, int64_dims=None,
    ),
    linear_attention_spec(
        "fused_recurrent_gla", "gla", GLA_ARGS, GLA_CASES,
        grads=("q", "k", "v", "g", "initial_state"), compile_cases=COMPILE, huge_grid=FUSED_HUGE_GRID,
    ),
]
