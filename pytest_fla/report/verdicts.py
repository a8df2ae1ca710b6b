"""What a failure says about the library under test: each failed test gets one verdict.

A conformance run over another library (``--fla-impl=fla``) fails for reasons of three
kinds, and only the first is a finding a maintainer must act on:

* ``defect``: the library is wrong on an input its contract allows: a result off the
  float64 reference, an output never written, a read or write out of bounds, a device
  fault or a refused launch ("invalid argument") on a valid input, two runs that differ,
  or a bad input accepted silently that then reads or writes out of bounds;
* ``contract``: a rule of this repository's contract (``docs/ops.md``) that the library
  does not promise: an error's type or wording, a bad input refused too late or not at
  all (and harmless), the final state's dtype, a keyword it does not take;
* ``refused``: the library's own clear refusal of the call: ``NotImplementedError`` (no
  backward, a version guard), or a ``ValueError`` / ``AssertionError`` with a message,
  raised in the library's own code before anything ran.

Two more name what is not the library's doing at all: ``environment`` (the machine ran
out of memory, or Triton's CPU interpreter cannot run a kernel a GPU runs) and ``harness`` (an exception raised in the plugin's own code that is not
a check's assertion: a bug of the checks or of an adapter, to be fixed, never counted as
the library's).

The verdict is taken where the exception is at hand (the process that ran the test, a
child process's included: it travels in ``user_properties``), from its type, its message
and the frame that raised it; a check that knows its assertion is a contract rule raises
:class:`ContractMismatch`. Where only the message travelled (a child that died, a
sanitizer report), :func:`from_message` decides from the message alone.
"""

from __future__ import annotations

import re
import sysconfig
from pathlib import Path

DEFECT, CONTRACT, REFUSED, ENVIRONMENT, HARNESS = "defect", "contract", "refused", "environment", "harness"
VERDICTS = (DEFECT, CONTRACT, REFUSED, ENVIRONMENT, HARNESS)
FINDINGS = (DEFECT,)  # the verdicts a run over another library reports as findings
PROPERTY = "fla_verdict"
WHY_PROPERTY = "fla_verdict_why"
# the why of a defect of the other op of an agreement check (:class:`OtherKernelOff`), the op named after it
OTHER_KERNEL = "wrong against the float64 reference: the other kernel,"


class ContractMismatch(AssertionError):
    """A check's assertion of a rule of this repository's contract that a library need not
    promise (an error's wording, the final state's dtype): its failure is a ``contract``
    verdict, never a ``defect``."""


class OtherKernelOff(AssertionError):
    """A check's assertion that found another op's kernel off the float64 reference, not
    its own op's (two kernels that disagree, of which only the other is wrong): a defect
    of ``culprit``."""

    def __init__(self, message: str, culprit: str):
        super().__init__(message)
        self.culprit = culprit


# (pattern, verdict, why), on the failure's message; first match wins. Device faults and
# refused launches first: whatever check met them, a valid input crashed the library.
MESSAGE_RULES = (
    (r"illegal memory access|illegal instruction|device-side assert|misaligned address|unspecified launch failure|"
     r"the device faulted|the test process (?:stopped|was killed|exited)|Fatal Python error|"
     r"crashed while running|ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]", DEFECT, "device fault"),
    (r"compute-sanitizer \w+: [1-9]\d* error", DEFECT, "compute-sanitizer's report"),
    (r"compute-sanitizer \w+ (?:gave up waiting|ended without its summary line)", ENVIRONMENT,
     "compute-sanitizer did not finish"),
    (r"invalid argument|invalid configuration argument|too many resources requested|OutOfResources",
     DEFECT, "launch refused on a valid input"),
    # the compile checks' problems (checks.capture): what a card would refuse at compile,
    # load or launch, found offline
    (r": does not compile: ", DEFECT, "does not compile for the arch"),
    (r"bytes of shared memory, over sm\d+'s limit|threads per block, over", DEFECT,
     "over the arch's limits (a launch it refuses)"),
    (r"grid axis \d is \d+, over CUDA's limit", DEFECT, "launch refused on a valid input"),
    (r"out of memory|OutOfMemoryError", ENVIRONMENT, "out of memory"),
    (r"\b0 active drivers \(", ENVIRONMENT, "no GPU driver on this machine (the library asked Triton's)"),
    (r"out of bounds|OutOfBounds|UnorderedWrites|past (?:the|its) end|before the start|outside every tensor argument",
     DEFECT, "out of bounds"),
    (r"were never written", DEFECT, "an output never written"),
    (r"differs between two identical runs", DEFECT, "nondeterministic"),
    (r"relative RMS error|NaN/Inf where the reference is finite|are not finite|shape .* != reference|"
     r"expected None|the last rows differ", DEFECT, "wrong against the float64 reference"),
    (r"unexpected keyword argument|missing \d+ required (?:positional|keyword)", CONTRACT,
     "a keyword the library does not take"),
    (r"DID NOT RAISE|Regex pattern did not match|kernel launch\(es\) before the error", CONTRACT,
     "a bad input not refused as the contract says"),
    (r"NotImplementedError|is causal only|not supported|requires triton|Triton version", REFUSED,
     "the library's own refusal"),
)


def from_message(message: str | None) -> tuple[str, str] | None:
    """(verdict, why) from a failure's message alone, or None where no rule matches."""
    for pattern, verdict, why in MESSAGE_RULES:
        if re.search(pattern, message or ""):
            return verdict, why
    return None


# exceptions that mean the call went wrong on the device or out of bounds, whatever the input
FAULT_CLASSES = ("OutOfBounds", "UnorderedWrites", "DeviceFault")


def faulted(exc: BaseException) -> bool:
    """Whether ``exc`` is a device fault or an access out of bounds (the
    interpreter's memcheck): a defect on any input, a bad one included."""
    while exc is not None:  # the interpreter wraps what a kernel raised in its own error
        if _is(exc, FAULT_CLASSES) or any(f"{name}(" in str(exc) for name in FAULT_CLASSES):
            return True
        found = from_message(f"{type(exc).__name__}: {exc}")
        if found is not None and found[1] == "device fault":
            return True
        exc = exc.__cause__ or exc.__context__
    return False


PLUGIN_ROOT = Path(__file__).resolve().parents[1]
# frames that raise on a library's behalf without being its code
FOREIGN = ("_pytest", "pluggy", "/torch/", "/triton/", "/numpy/", "<")
# Python's own modules; a library installed beside them (site-packages) is not one of them
STDLIB = sysconfig.get_paths()["stdlib"]


def _foreign(path: str) -> bool:
    return any(part in path for part in FOREIGN) or (path.startswith(STDLIB) and "-packages" not in path)


def _raiser(excinfo, checks: tuple[str, ...] = ()) -> str:
    """Who raised the exception: ``plugin`` (the checks, the adapters, the test's own file
    ``checks``), ``library`` (the code under test), or ``toolkit`` (torch, Triton: on the
    library's behalf)."""
    for entry in reversed(excinfo.traceback):
        path = str(entry.path)
        if path.startswith(str(PLUGIN_ROOT)) or path in checks:
            return "plugin"
        if not _foreign(path):
            return "library"
        if "/torch/" in path or "/triton/" in path:
            return "toolkit"
    return "toolkit"


def _is(exc, names: tuple[str, ...]) -> bool:
    return any(cls.__name__ in names for cls in type(exc).__mro__)


def of_exception(excinfo, checks: tuple[str, ...] = ()) -> tuple[str, str]:
    """(verdict, why) of the exception a failed test raised; ``checks``: files whose
    frames are the check's own (the test module's), as the plugin's are."""
    exc, message = excinfo.value, str(excinfo.value)
    if isinstance(exc, ContractMismatch):
        return CONTRACT, "a rule of this repository's contract"
    if isinstance(exc, OtherKernelOff):
        return DEFECT, f"{OTHER_KERNEL} {exc.culprit}'s"
    if isinstance(exc, ImportError):
        # a module the library imports is not installed here (fla-core's einops, where a run
        # installs the library alone): nothing said of its kernels
        return ENVIRONMENT, f"a module the library imports is not installed: {message}"
    by_message = from_message(f"{type(exc).__name__}: {message}")
    if by_message is not None and by_message[0] in (DEFECT, ENVIRONMENT) and not isinstance(exc, AssertionError):
        return by_message  # a device fault, a refused launch, out of memory: whoever raised it
    if _is(exc, ("InterpreterError",)) and not faulted(exc):
        return ENVIRONMENT, "Triton's CPU interpreter cannot run this kernel (a GPU can)"
    if (isinstance(exc, AssertionError) or _is(exc, ("Failed",))) and _raiser(excinfo, checks) == "plugin":
        return by_message if by_message is not None else (DEFECT, "a check's assertion")
    raiser = _raiser(excinfo, checks)
    if isinstance(exc, TypeError) and by_message is not None and by_message[0] == CONTRACT:
        return by_message
    if _is(exc, ("NotImplementedError",)):
        return REFUSED, "NotImplementedError raised by the library"
    if isinstance(exc, RuntimeError) and "does not require grad and does not have a grad_fn" in message:
        # the op's outputs left the autograd graph (fla-core 0.6.0's fused_recurrent_kda):
        # it has no backward, and says so at the first backward call, not with a wrong gradient
        return REFUSED, "the op has no backward: its outputs carry no grad_fn"
    if raiser == "library" and _is(exc, ("ValueError", "AssertionError", "RuntimeError")) and message.strip():
        return REFUSED, f"{type(exc).__name__} raised by the library's own code"
    if raiser == "plugin":
        return HARNESS, f"{type(exc).__name__} raised in the plugin's own code"
    return DEFECT, f"{type(exc).__name__} raised inside the call (a crash on a valid input)"


def culprit(why: str | None, op: str | None) -> str | None:
    """The op a failure's verdict counts against: the other kernel an agreement check found
    off (its ``why`` names it), else the test's own op."""
    if why and why.startswith(OTHER_KERNEL):
        return why.removeprefix(OTHER_KERNEL).strip().removesuffix("'s")
    return op


def counts(records) -> dict:
    """verdict -> number of failed records carrying it (failed records without one: ``unclassed``)."""
    out: dict = {}
    for record in records:
        if record.outcome == "failed" and record.op is not None:  # only an op's checks say something of a library
            key = record.verdict or "unclassed"
            out[key] = out.get(key, 0) + 1
    return out
