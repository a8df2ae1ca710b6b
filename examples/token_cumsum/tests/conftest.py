"""token_cumsum's spec, handed to pytest-fla: every generic check, arch target,
sanitizer run and report then covers the op (the checks themselves are imported in
test_conformance.py and test_compile.py)."""

from pytest_fla.api import (
    Arg,
    Case,
    ErrorInput,
    chain_errors,
    dtype_errors,
    op_spec,
    shape_errors,
    varlen_errors,
    with_args,
)

ARGS = {
    "x": Arg(("B", "T", "D")),
    "initial_state": Arg(("N", "D"), "state", optional=True),
}
WITH_STATE = {"initial_state": True, "output_final_state": True}


def token_cumsum_errors(spec, device):
    """Bad calls token_cumsum must reject before launching anything."""
    case = spec.cases[0]
    kwargs = spec.sample(case, "fp32", device).kwargs
    yield from dtype_errors(kwargs, "x")
    yield ErrorInput("x_2d", with_args(kwargs, x=kwargs["x"][0]), ValueError, "`x`.*shape")
    yield ErrorInput("initial_state_bf16", with_args(kwargs, initial_state=kwargs["initial_state"].bfloat16()),
                     TypeError, "`initial_state`.*dtype")
    yield from shape_errors(spec, kwargs, "x")
    yield from varlen_errors(spec, case, device)


TOKEN_CUMSUM = op_spec(
    "token_cumsum",
    op="token_cumsum.token_cumsum",
    reference="token_cumsum.reference.token_cumsum",
    args=ARGS,
    # CPU sizes: D not a power of two and past one 32-wide block is not needed: one block,
    # masked. GPU sizes (gpu_dims) are realistic.
    cases=(
        Case("state", {"B": 2, "T": 9, "D": 24}, options=WITH_STATE, gpu_dims={"B": 4, "T": 2048, "D": 2000}),
        Case("plain", {"B": 3, "T": 5, "D": 7}, gpu_dims={"B": 2, "T": 4096, "D": 4096}),
    ),
    grads=("x", "initial_state"),
    errors=chain_errors(token_cumsum_errors),
    chunk_size=16,  # no chunks: the packings' lengths just sit around 16
    compile_cases=(Case("d4096", {"B": 1, "T": 64, "D": 4096}, options=WITH_STATE),),
    # one program per sequence and channel block, all on grid axis 0: 70000 rows must run
    huge_grid={"B": 70000, "T": 2, "D": 16},
    int64_dims={"B": 2, "T": 4096, "D": 4096},
)


def pytest_fla_specs(config):
    return [TOKEN_CUMSUM]
