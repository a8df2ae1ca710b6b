"""References whose kernels are not written yet, described as specs without a kernel
(``op=None``): ``tests/test_reference.py`` draws their inputs from these, and the
conformance checks leave them out.

When a family's kernel spec lands, it checks the same reference and takes over (a
kernel spec always wins, ``specs.reference_specs``); its entry here can then go.
"""

from __future__ import annotations

import math

from ..builders import op_spec
from ..inputs import Arg
from ..spec import Case, Sample
from .common import STATE

SMALL = {"B": 2, "T": 24, "H": 2, "K": 16, "V": 24}
WITH_STATE = {"initial_state": True, "output_final_state": True}
RECURRENT_GRADS = ("initial_state",)


def _rwkv7_like(names: tuple[str, str, str]):
    """rwkv7's realistic inputs (the contract's): ``kk = normalize(randn)``, ``a = -kk``,
    ``b = kk * sigmoid(randn)``, ``w = -e^{-1/2} sigmoid(randn)``. ``a`` is drawn as
    ``kk`` and ``b`` as the sigmoid, then combined; ``names`` are (a, b, w)."""
    a, b, w = names

    def finish(case, sample: Sample, lengths, gen) -> None:
        kw = sample.kwargs
        kk = kw[a]
        kw[a], kw[b] = -kk, kk * kw[b]
        kw[w] = -math.exp(-0.5) * kw[w]

    return finish


TOKENS_K = ("B", "T", "H", "K")
RWKV7_ARGS = {
    "r": Arg(TOKENS_K), "w": Arg(TOKENS_K, "beta"), "k": Arg(TOKENS_K), "v": Arg(("B", "T", "H", "V")),
    "a": Arg(TOKENS_K, "unit"), "b": Arg(TOKENS_K, "beta"), "initial_state": STATE,
}
DPLR_ARGS = {
    "q": Arg(TOKENS_K), "k": Arg(TOKENS_K), "v": Arg(("B", "T", "H", "V")),
    "a": Arg(TOKENS_K, "unit"), "b": Arg(TOKENS_K, "beta"), "gk": Arg(TOKENS_K, "beta"), "initial_state": STATE,
}
RWKV6_ARGS = {
    "r": Arg(TOKENS_K), "k": Arg(TOKENS_K), "v": Arg(("B", "T", "H", "V")),
    "w": Arg(TOKENS_K, "log_gate"), "u": Arg(("H", "K")), "initial_state": STATE,
}
HGRN_ARGS = {
    "x": Arg(("B", "T", "D")), "g": Arg(("B", "T", "D"), "log_gate"),
    "initial_state": Arg(("N", "D"), "state", optional=True),
}
ATTENTION_ARGS = {
    "q": Arg(("B", "T", "HQ", "K")), "k": Arg(TOKENS_K), "v": Arg(("B", "T", "H", "V")),
}

SPECS = [
    op_spec("rwkv7", op=None, reference="reference.rwkv7", args=RWKV7_ARGS, finish=_rwkv7_like(("a", "b", "w")),
            cases=(Case("state", SMALL, options=WITH_STATE),), grads=RECURRENT_GRADS),
    op_spec("dplr_delta_rule", op=None, reference="reference.dplr_delta_rule", args=DPLR_ARGS,
            finish=_rwkv7_like(("a", "b", "gk")), cases=(Case("state", SMALL, options=WITH_STATE),), grads=RECURRENT_GRADS),
    op_spec("rwkv6", op=None, reference="reference.rwkv6", args=RWKV6_ARGS,
            cases=(Case("state", SMALL, options=WITH_STATE),), grads=RECURRENT_GRADS),
    op_spec("hgrn", op=None, reference="reference.hgrn", args=HGRN_ARGS,
            cases=(Case("state", {"B": 2, "T": 24, "D": 32}, options=WITH_STATE),), grads=RECURRENT_GRADS),
    op_spec("attention", op=None, reference="reference.attention", args=ATTENTION_ARGS, outputs=("o",),
            cases=(Case("causal_window_gqa", {**SMALL, "HQ": 4}, options={"causal": True, "window_size": 2}),
                   Case("noncausal", {**SMALL, "HQ": 2}, options={"causal": False}))),
]
