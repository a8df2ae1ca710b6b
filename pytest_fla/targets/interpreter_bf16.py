"""bf16 and tf32 arithmetic in Triton's CPU interpreter as a GPU does it, for accuracy
measurements.

Triton's interpreter (3.6 to 3.9) keeps bf16 values as their uint16 bit patterns and
multiplies ``tl.dot`` operands as those integers, adds and multiplies bf16 tensors the
same way, and rounds float32 -> bf16 conversions toward zero (``pytest_fla.toolchain``);
it multiplies float32 operands of a one-pass tf32 ``tl.dot`` (``input_precision="tf32"``,
the default) exactly. :func:`install` replaces those operations in this process with what
the GPU computes:

* ``tl.dot`` of bf16 operands: exact products accumulated in float32 (a bf16 x bf16
  product fits float32's 24-bit significand, as on tensor cores; the summation order
  differs from the hardware's, which moves the result by float32 roundings only);
* ``tl.dot`` of float32 operands in one-pass tf32: each operand's low 13 significand bits
  dropped, as the tensor cores read them (a truncation: a kernel that wants tf32 rounded
  to nearest rounds its operands itself, ``kernels._gate_levels.gated_operand``), then
  multiplied exactly and accumulated in float32; ``tf32x3`` and ``ieee`` stay as they are;
* a float32 -> bf16 conversion: round to nearest even (``.to(tl.bfloat16)``'s default);
* elementwise bf16 arithmetic: computed in float32 and rounded once to bf16.

It is a measuring aid (``benchmarks/peer_accuracy.py`` on the CPU) and, asked for
(``--fla-bf16-emulated``), lets the suite check bf16 on the CPU: by default the suite
skips bf16 there and checks it on the GPU. ``install`` also sets
``FLA_INTERPRETER_BF16=1``, which makes kernels that feed the interpreter float32
operands in place of bf16 ones (``kernels._arch.interpreter_dots_exact``) feed bf16 as
on a GPU, so their operand roundings are measured too.
"""

from __future__ import annotations

import os

import numpy as np

from .. import environment

INSTALLED = False  # in this process (``toolchain.interpreter_skip_reason`` reads it)


def to_float32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) as float32 values."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16 (ties to even), as uint16 bit patterns."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def tf32_truncated(values: np.ndarray) -> np.ndarray:
    """float32 values with their low 13 significand bits cleared: what one-pass tf32 tensor
    cores read of them (Inf and NaN keep their class: NaN's payload sits in the top bits
    Triton produces, and an Inf has none)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    return (values.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def install() -> bool:
    """Patch this process's interpreter (idempotent); False where its shape is not the
    one this was written for (then nothing is patched)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    needed = ("create_dot", "cast_impl", "create_fp_to_fp", "binary_op")
    if builder is None or handle is None or not all(hasattr(builder, n) for n in needed):
        return False
    global INSTALLED
    if getattr(builder.create_dot, "fla_bf16", False):
        INSTALLED = True
        return True
    bf16 = tl.bfloat16
    original_dot, original_cast = builder.create_dot, builder.cast_impl
    original_fp_to_fp, original_binary = builder.create_fp_to_fp, builder.binary_op

    def as_float(h):
        return to_float32(h.data) if h.dtype.scalar == bf16 else h.data

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if getattr(input_precision, "name", None) == "TF32" and a.dtype.scalar == b.dtype.scalar == tl.float32:
            product = np.matmul(tf32_truncated(a.data), tf32_truncated(b.data), dtype=np.float32)
            return handle(product + d.data, d.dtype.scalar)
        if bf16 not in (a.dtype.scalar, b.dtype.scalar):
            return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        product = np.matmul(as_float(a).astype(np.float32), as_float(b).astype(np.float32), dtype=np.float32)
        return handle(product + d.data, d.dtype.scalar)

    def rounded(src, dst_type, fallback):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == bf16:
            return handle(to_bf16_bits(src.data), bf16)
        return fallback()

    def cast_impl(self, src, dst_type):
        return rounded(src, dst_type, lambda: original_cast(self, src, dst_type))

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        return rounded(src, dst_type, lambda: original_fp_to_fp(self, src, dst_type, rounding_mode))

    def binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar != bf16:
            return original_binary(self, lhs, rhs, op)
        out = op(as_float(lhs), as_float(rhs))
        if out.dtype == np.bool_:
            return handle(out, tl.int1)
        return handle(to_bf16_bits(out), bf16)

    create_dot.fla_bf16 = True
    builder.create_dot, builder.cast_impl = create_dot, cast_impl
    builder.create_fp_to_fp, builder.binary_op = create_fp_to_fp, binary_op
    os.environ[environment.INTERPRETER_BF16] = "1"
    INSTALLED = True
    return True
