"""``--fla-quick``: a first run that shows what the suite checks, in minutes.

Of the op tests it keeps:

* for each op and numeric check (forward, backward, varlen, agreement, state dtypes, every
  output written, the grid rule, ...), the check's first test: its first case in fp32 (the
  first of the check's parameters), so every check runs on every op once;
* every error-input and device-mismatch test: each is another bad call, refused before
  any launch in milliseconds;
* every compile test, compiling each kernel once per arch for the whole run (the ``run``
  compile scope) in bf16, unless ``--fla-compile-scope`` / ``--fla-compile-dtypes`` say
  otherwise.

It leaves out every other test: those of no op (the plugin's own, the kernels' piece
tests, the references'), the ``torch.compile`` checks (half the quick run's interpreter
time, were they in) and the reproducers, which the full run (without ``--fla-quick``) adds,
with every case and dtype.
The report's matrix still has a row per op and a column per check.
"""

from __future__ import annotations

from ..report import op_and_check

GENERIC_CHECKS = "pytest_fla.checks.conformance"  # the module of the ops x checks matrix's checks
# Checks whose every test is kept: each is a different bad input, refused before a launch.
EVERY_TEST = ("error_inputs", "device_mismatch")
SCOPE = "run"  # the compile scope of a quick run (compile_per_arch.SCOPES)
COMPILE_DTYPES = "bf16"


def split(items, compile_arch) -> tuple[list, list]:
    """``(kept, left out)`` of ``items``, in their order; ``compile_arch(item)`` is the arch
    of a compile test, else None."""
    kept, left_out, seen = [], [], set()
    for item in items:
        op, check = op_and_check(item)
        if compile_arch(item) is not None:
            kept.append(item)
        elif op is None or getattr(getattr(item, "function", None), "__module__", None) != GENERIC_CHECKS:
            left_out.append(item)
        elif check in EVERY_TEST or (op, check) not in seen:
            seen.add((op, check))
            kept.append(item)
        else:
            left_out.append(item)
    return kept, left_out
