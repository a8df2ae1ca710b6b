"""A float32 ``tl.exp`` in Triton's CPU interpreter computed as NVIDIA GPUs compute it.

Triton (3.6 to 3.9) lowers a float32 ``tl.exp(x)`` for NVIDIA GPUs to
``ex2.approx.f32(x * log2(e))``, the product rounded to float32 (offline PTX, sm80 to sm100;
``tests/plugin/test_interpreter_exp.py`` reads it). Rounding the product moves the exponent
by up to half a unit of ``x * log2(e)``'s last place, so the result's relative error grows
with ``|x|``: about ``|x| * 2**-24``, fifty units in the last place at ``x = -50``, as a
strong decay gives. The interpreter's ``np.exp`` is within a unit there: a kernel measured
on the CPU was more accurate than the same kernel on a GPU, and an ``exp`` written as
``exp2(x * log2(e))`` (the same instructions on a GPU, ``ftz`` aside) read as an accuracy
loss on the CPU alone (``mutate --rewrites``: errors x2.7 and x3.7 in two fp32 recurrences).

:func:`install` makes the interpreter's float32 ``exp`` that product and ``np.exp2`` of it.
``ex2.approx``'s own error is not modelled (on an H200 the patched interpreter is within two
units of the GPU's results: ``tests/plugin/test_interpreter_exp.py``); float64 (``__nv_exp``) and
other dtypes keep numpy's. The plugin installs it whenever kernels run in the interpreter.
"""

from __future__ import annotations

LOG2E = 1.4426950408889634


def gpu_exp(x):
    """``exp`` of a numpy float32 array as ``ex2(x * log2(e))`` with the product rounded to
    float32 (numpy is imported here: a controller that only coordinates workers has none)."""
    import numpy as np

    if x.dtype != np.float32:
        return np.exp(x)
    return np.exp2(np.multiply(x, np.float32(LOG2E), dtype=np.float32))


def supported() -> bool:
    """Whether this process's Triton interpreter has the shape :func:`install` patches (the
    plugin's controller asks, for its header line, before its workers install it)."""
    try:
        import numpy  # noqa: F401  (gpu_exp's)
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    return builder is not None and hasattr(builder, "create_exp") and hasattr(builder, "unary_op")


def install() -> bool:
    """Patch this process's interpreter (idempotent); False where its shape is not the one
    this was written for (then nothing is patched)."""
    if not supported():
        return False
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_exp, "fla_gpu_exp", False):
        return True

    def create_exp(self, arg):
        return self.unary_op(arg, gpu_exp)

    create_exp.fla_gpu_exp = True
    builder.create_exp = create_exp
    return True
