"""References whose kernels are not written yet, described as specs without a kernel
(``op=None``): ``tests/test_reference.py`` draws their inputs from these, and the
conformance checks leave them out.

When a family's kernel spec lands, it checks the same reference and takes over (a
kernel spec always wins, ``specs.reference_specs``); its entry here can then go.
"""

from __future__ import annotations

from ..ops.builders import op_spec
from ..ops.inputs import Arg
from ..ops.spec import Case
from .common import STATE

SMALL = {"B": 2, "T": 24, "H": 2, "K": 16, "V": 24}
WITH_STATE = {"initial_state": True, "output_final_state": True}
RECURRENT_GRADS = ("initial_state",)


TOKENS_K = ("B", "T", "H", "K")
RWKV6_ARGS = {
    "r": Arg(TOKENS_K), "k": Arg(TOKENS_K), "v": Arg(("B", "T", "H", "V")),
    "w": Arg(TOKENS_K, "log_gate"), "u": Arg(("H", "K")), "initial_state": STATE,
}
HGRN_ARGS = {
    "x": Arg(("B", "T", "D")), "g": Arg(("B", "T", "D"), "log_gate"),
    "initial_state": Arg(("N", "D"), "state", optional=True),
}

SPECS = [
    op_spec("rwkv6", op=None, reference="reference.rwkv6", args=RWKV6_ARGS,
            cases=(Case("state", SMALL, options=WITH_STATE),), grads=RECURRENT_GRADS),
    op_spec("hgrn", op=None, reference="reference.hgrn", args=HGRN_ARGS,
            cases=(Case("state", {"B": 2, "T": 24, "D": 32}, options=WITH_STATE),), grads=RECURRENT_GRADS),
]
