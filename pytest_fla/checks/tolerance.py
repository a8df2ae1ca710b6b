"""How close a kernel's output must be to the float64 reference.

Rule (per output tensor, against the float64 reference ``ref`` computed from the *same*
rounded inputs):

* relative RMS error ``‖out − ref‖₂ / ‖ref‖₂ <= rel_rms``;
* max abs error ``max|out − ref| <= max_abs * max|ref|`` (scaled to the reference, so
  one bad element in a large tensor cannot hide in the RMS);
* no NaN or Inf where the reference is finite.

Why these numbers. With unit roundoff ``u`` (fp32 ``2^-24``, fp16 ``2^-11``, bf16
``2^-8``), a kernel that reads its inputs in the dtype, accumulates in fp32 and rounds
the output once already has a relative RMS error of about ``u/√3``: that is the
low-precision baseline no kernel can beat. Chunked kernels round a few intermediates to
the dtype before tensor-core products (scores, states, gated keys), each adding about
the same in quadrature, so correct bf16/fp16 kernels land at one to three ``u``; the
thresholds sit at about four ``u`` for outputs and eight ``u`` for gradients, whose
cumulative-sum structure (gate gradients are reverse cumsums of products) adds error.
fp32 kernels must use ``ieee`` or ``tf32x3`` products: plain tf32 (``u = 2^-11``,
relative errors near ``3e-4``) fails the fp32 threshold, which is the point. It is this
repository's contract, though, not every library's: one that computes fp32 at tf32 in its
dots by design (the peer library's chunked kernels) is not wrong, it promises less. tf32
keeps fp16's 10-bit significand, so an fp32 failure whose every error is within the fp16
limits is what tf32 products give (``within_tf32``), and the failure is a contract verdict
(``ContractMismatch``); one past the fp16 limits is wrong at any product precision.

The thresholds were then checked against measured errors of the kernels in this repo:
``FLA_RECORD_ERRORS=path.jsonl`` makes every comparison append its measured errors, and
``docs/tolerances.md`` lists what was measured (CPU interpreter and H100/H200) and the
command. A threshold is never raised to make a failing case pass: a case that exceeds
it is a kernel bug until shown otherwise.

The error ratchet. The limits above are budgets: a kernel that loses half its precision
(a tf32 operand truncated instead of rounded, a constant written with too few digits)
can stay inside them. ``FLA_ERROR_BASELINE=path.jsonl`` (a file ``FLA_RECORD_ERRORS``
wrote, from the same tests on the same machine: the interpreter's results repeat bit for
bit) makes every comparison also hold its errors to the recorded ones: relative RMS at
most ``RATCHET.rel_rms`` times the recorded value, max error at most ``RATCHET.max_abs``
times (one element, so a rounding that flips one ulp can double it), each plus a floor
(:func:`ratchet_floor`: a recorded error of zero is not a limit of zero). The
mutation command runs every mutant so (``docs/design.md``, "Mutation testing").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from .. import environment
from ..report.verdicts import ContractMismatch


@dataclass(frozen=True)
class Tolerance:
    rel_rms: float
    max_abs: float  # relative to max |ref|


# unit roundoffs: fp32 6.0e-8, fp16 4.9e-4, bf16 3.9e-3
FORWARD = {
    "fp32": Tolerance(rel_rms=2e-5, max_abs=1e-4),
    "fp16": Tolerance(rel_rms=2e-3, max_abs=1e-2),
    "bf16": Tolerance(rel_rms=1.6e-2, max_abs=6e-2),
}
BACKWARD = {
    "fp32": Tolerance(rel_rms=1e-4, max_abs=5e-4),
    "fp16": Tolerance(rel_rms=4e-3, max_abs=2e-2),
    "bf16": Tolerance(rel_rms=3.2e-2, max_abs=1.2e-1),
}
UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
# A mutant is an accuracy loss worth the name when its RMS error grows by a quarter: the
# peer comparison's bar is 1.2x (docs/tolerances.md), and reordered fp32 sums, which
# round a few bf16 outputs the other way, move the RMS by a few percent.
RATCHET = Tolerance(rel_rms=1.25, max_abs=2.0)
# The floor: 1/16 of the dtype's unit roundoff, and at least 8 of fp32's, since the kernels
# compute in fp32 whatever the dtype. fp32 errors of a few roundings move by whole roundings:
# rewrites equal in exact arithmetic (``mutate --rewrites``) moved rms_norm's fp32 dweight
# from 9.9e-8 to 1.28e-7, and two hgrn kernels that agreed bit for bit to 3.5e-7 (5.9 fp32
# roundings) apart.
RATCHET_FLOOR = 1 / 16
RATCHET_FP32_FLOOR = 8 * UNIT_ROUNDOFF["fp32"]

# Two kernels computing the same function (chunk vs fused_recurrent) may each sit at the
# threshold on opposite sides, so they are compared with twice the forward budget.
AGREEMENT = {k: Tolerance(2 * t.rel_rms, 2 * t.max_abs) for k, t in FORWARD.items()}
# what an fp32 result computed with tf32 products may reach: fp16's limits (the same significand)
TF32_LIMITS = {"forward": FORWARD["fp16"], "backward": BACKWARD["fp16"], "agreement": AGREEMENT["fp16"]}


def errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """``(relative RMS error, max abs error / max |ref|)`` of ``out`` against ``ref``."""
    out64, ref64 = out.detach().double(), ref.detach().double()
    diff = out64 - ref64
    ref_norm = ref64.norm().item()
    ref_max = ref64.abs().max().item() if ref64.numel() else 0.0
    diff_norm = diff.norm().item()
    diff_max = diff.abs().max().item() if diff.numel() else 0.0
    # An all-zero reference (e.g. a gradient that is truly zero) is compared absolutely.
    rel = diff_norm / ref_norm if ref_norm > 0 else diff_norm
    rel_max = diff_max / ref_max if ref_max > 0 else diff_max
    return rel, rel_max


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]


def _record(name: str, dtype: str, kind: str, rel: float, rel_max: float) -> None:
    path = os.environ.get(environment.RECORD_ERRORS)
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"test": _current_test(), "tensor": name, "dtype": dtype, "kind": kind,
                            "rel_rms": rel, "max_abs": rel_max}) + "\n")


_baselines: dict[str, dict] = {}  # path -> (test, tensor, dtype, kind) -> [(rel_rms, max_abs), ...]
_compared: dict[tuple, int] = {}  # how many times this process compared each key


def read_errors(path) -> dict:
    """A ``FLA_RECORD_ERRORS`` file's errors, by (test, tensor, dtype, kind), in the order
    recorded (a test may compare one tensor more than once)."""
    table: dict = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                e = json.loads(line)
                table.setdefault((e["test"], e["tensor"], e["dtype"], e["kind"]), []).append((e["rel_rms"], e["max_abs"]))
    return table


def recorded_errors(path: str) -> dict:
    """:func:`read_errors` of the baseline, read once per process."""
    if path not in _baselines:
        _baselines[path] = read_errors(path)
    return _baselines[path]


def ratchet_floor(dtype: str) -> float:
    return max(RATCHET_FLOOR * UNIT_ROUNDOFF[dtype], RATCHET_FP32_FLOOR)


def ratchet_limits(recorded: tuple[float, float], dtype: str) -> tuple[float, float]:
    floor = ratchet_floor(dtype)
    return RATCHET.rel_rms * recorded[0] + floor, RATCHET.max_abs * recorded[1] + floor


def _ratchet(name: str, dtype: str, kind: str, rel: float, rel_max: float) -> str | None:
    """Why the errors break the ratchet (``FLA_ERROR_BASELINE``), or None."""
    path = os.environ.get(environment.ERROR_BASELINE)
    if not path:
        return None
    key = (_current_test(), name, dtype, kind)
    nth = _compared.get(key, 0)
    _compared[key] = nth + 1
    recorded = recorded_errors(path).get(key, [])
    if nth >= len(recorded):
        return None  # a comparison the baseline did not make: nothing to hold it to
    rms_limit, max_limit = ratchet_limits(recorded[nth], dtype)
    if rel <= rms_limit and rel_max <= max_limit:
        return None
    return (f"error ratchet: {name} ({dtype}, {kind}): relative RMS error {rel:.3e}, max {rel_max:.3e}, "
            f"against {recorded[nth][0]:.3e} and {recorded[nth][1]:.3e} recorded ({path}); within its limits, "
            f"but past {RATCHET.rel_rms}x and {RATCHET.max_abs}x the recorded errors")


@dataclass(frozen=True)
class Mismatch:
    """A comparison that failed: what it found, and the index of the element that shows it
    best (``which``: the first non-finite one, or the one furthest from the reference), or
    None where no element does (a shape, a missing tensor)."""

    message: str
    at: tuple[int, ...] | None = None
    which: str = "worst element"
    by_ratchet: bool = False  # within the limits, past the recorded errors
    within_tf32: bool = False  # fp32, past its limits, within fp16's: what tf32 products give


def mismatch(name: str, out, ref, dtype: str, kind: str = "forward", scale=None) -> Mismatch | None:
    """How ``out`` fails the rule above against the float64 ``ref`` (``kind``: forward,
    backward or agreement), or None where it passes. ``scale``: what the error is measured
    against instead of ``ref`` (a sum's per-element sum of its terms' magnitudes;
    ``checks.token_masses``)."""
    if ref is None:
        return None if out is None else Mismatch(f"{name}: expected None, got a tensor")
    if out is None:
        return Mismatch(f"{name}: expected a tensor, got None")
    if tuple(out.shape) != tuple(ref.shape):
        return Mismatch(f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    finite = torch.isfinite(ref.detach())
    bad = finite & ~torch.isfinite(out.detach())
    if bad.any():
        return Mismatch(f"{name}: {int(bad.sum())} of {out.numel()} elements are NaN/Inf where the reference is finite",
                        tuple(torch.nonzero(bad)[0].tolist()), "first")
    tol = {"forward": FORWARD, "backward": BACKWARD, "agreement": AGREEMENT}[kind][dtype]
    out64, ref64 = torch.where(finite, out.detach().double(), 0.0), torch.where(finite, ref.detach().double(), 0.0)
    if scale is None:
        rel, rel_max = errors(out64, ref64)
    else:
        scale64 = scale.detach().double()
        rel, rel_max = errors(out64 - ref64 + scale64, scale64)  # |diff| over the scale's norm and max
        name = f"{name} (against the sum of its terms' magnitudes)"
    _record(name, dtype, kind, rel, rel_max)
    worst = None
    if out64.numel():
        worst = tuple(int(i) for i in torch.unravel_index(torch.argmax((out64 - ref64).abs()), out64.shape))
    if not (rel <= tol.rel_rms and rel_max <= tol.max_abs):
        tf32 = TF32_LIMITS[kind] if dtype == "fp32" else None
        within_tf32 = tf32 is not None and rel <= tf32.rel_rms and rel_max <= tf32.max_abs
        return Mismatch(f"{name} ({dtype}, {kind}): relative RMS error {rel:.3e} (limit {tol.rel_rms:.1e}), "
                        f"max abs error {rel_max:.3e} x max|ref| (limit {tol.max_abs:.1e})"
                        + ("; within the fp16 limits, as tf32 products give" if within_tf32 else ""),
                        worst, within_tf32=within_tf32)
    ratchet = _ratchet(name, dtype, kind, rel, rel_max)
    return None if ratchet is None else Mismatch(ratchet, worst, by_ratchet=True)


def assert_close(name: str, out, ref, dtype: str, kind: str = "forward", scale=None) -> None:
    """Assert ``out`` matches the float64 ``ref`` under the rule above (:func:`mismatch`)."""
    found = mismatch(name, out, ref, dtype, kind, scale)
    if found is not None:
        where = "" if found.at is None else f" ({found.which} at index {found.at})"
        raise failure(found.message + where, [found])


TF32_NOTE = ("every comparison that failed is within the fp16 limits: fp32 computed with tf32 products "
             "(fp16's 10-bit significand); fp32 to fp32 precision is this repository's contract")


def failure(message: str, found: list[Mismatch]) -> AssertionError:
    """The error for failed comparisons ``found``: a contract mismatch where each is fp32
    within the fp16 limits (tf32 products, the rule above), else an assertion error."""
    if found and all(f.within_tf32 for f in found):
        return ContractMismatch(f"{message}\n({TF32_NOTE})")
    return AssertionError(message)
