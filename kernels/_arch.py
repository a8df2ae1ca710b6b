"""The target GPU architecture that kernels choose their configs for.

Kernels pick block sizes, stages and warps from the *target* arch's budget, not the
physical device, so that emulation (``TRITON_OVERRIDE_ARCH=sm80`` on a Hopper card) and
offline compile-only checks see the configs a real card of that arch would get.

The target is read, in order, from ``FLA_TARGET_ARCH`` (set by the pytest plugin per
target), ``TRITON_OVERRIDE_ARCH`` (Triton's own emulation switch), the current CUDA
device, and finally sm80 under the CPU interpreter. Nothing here initialises CUDA at
import time.
"""

from __future__ import annotations

import functools
import os

import triton

# Opt-in shared memory per block, in bytes, that configs are chosen for (the CUDA
# programming guide's compute capability tables). The kernels' own: they run without the
# test plugin, whose table of the same limits (pytest_fla/targets/arch_table.py) is what a
# compile check holds their launches to; tests/plugin/test_targets.py holds the two equal.
SHARED_MEMORY_LIMIT = {75: 65536, 80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448, 120: 101376}
KNOWN_ARCHS = tuple(sorted(SHARED_MEMORY_LIMIT))

def parse_arch(text: str | int) -> int:
    """``'sm80'``, ``'sm_90a'``, ``'90'`` or ``90`` (as ``FLA_TARGET_ARCH`` and
    ``TRITON_OVERRIDE_ARCH`` name a target) -> the capability as an integer (90)."""
    if isinstance(text, int):
        return text
    digits = text.strip().lower().removeprefix("sm").removeprefix("_").removesuffix("a")
    if not digits.isdigit():
        raise ValueError(f"cannot parse GPU arch {text!r}: expected e.g. 'sm80' or 'sm90'")
    return int(digits)


def _limit_of(arch: int) -> int:
    """An arch not in the table gets the nearest older one's budget."""
    if arch in SHARED_MEMORY_LIMIT:
        return SHARED_MEMORY_LIMIT[arch]
    older = [a for a in KNOWN_ARCHS if a <= arch]
    return SHARED_MEMORY_LIMIT[older[-1] if older else KNOWN_ARCHS[0]]

# True while a launch-capture context is active (the plugin's compile-only mode): wrappers
# then accept CPU tensors, and each ``kernel[grid](...)`` is recorded, compiled offline
# for the target, and never run.
CAPTURING_LAUNCHES = False

# Compile options every launch passes (``kernel[grid](..., **COMPILE_OPTIONS)``).
# Multiply-add contraction (FMA) is stated rather than left to Triton's default: that
# default is on through Triton 3.9 (which warns that 3.10 turns it off), and the kernels'
# numerics and timings were measured with it on.
COMPILE_OPTIONS = {"enable_fp_fusion": True}

# The per-step (fused recurrent) kernels turn contraction off. Their sums over a tile's
# columns (``tl.sum(S * x[None, :], 1)``) reduce by a butterfly over a warp's lanes; with
# contraction the butterfly's first stage is fma(own product, the neighbour's rounded
# product), so each lane rounds a different product and the lanes' copies of one sum differ
# in the last bit. Those copies reach a store through shared memory, several lanes writing
# one word with different values: a write-after-write race that racecheck reports
# (triton-lang/triton#7264; seen in the gated and delta-rule fused recurrences on sm90).
# With products rounded first, every lane adds the same numbers.
RECURRENT_OPTIONS = {**COMPILE_OPTIONS, "enable_fp_fusion": False}


def launch_options(num_warps: int, num_stages: int = 1, maxnreg: int | None = None) -> dict:
    """``kernel[grid](..., **launch_options(...))``: warps, stages, ``COMPILE_OPTIONS``, and
    an optional cap on registers per thread (the interpreter ignores it). Left alone, ptxas
    gives the level kernels all 255 registers at 8 warps, one block per multiprocessor; a cap
    of 128 fits two but spills, and on the H100 every cap tried was slower (the configs keep
    None; ``benchmarks/config_sweep.py`` has the variants, the results their times)."""
    options = {"num_warps": num_warps, "num_stages": num_stages, **COMPILE_OPTIONS}
    if maxnreg:
        options["maxnreg"] = maxnreg
    return options


# ``os.environ``'s bytes mapping on POSIX, which its ``get`` reads through an encode and, for
# a name that is not set, a caught KeyError (about 0.7 us a name): the target arch is read on
# every call, and a host-bound op's call pays each microsecond. Writes through ``os.environ``
# (``monkeypatch.setenv`` included) update it, so it answers as ``os.environ.get`` does.
_ENVIRON_BYTES = getattr(os.environ, "_data", None) if os.name == "posix" else None


# the encoded keys of the names read on every call, filled once at import: torch.compile
# traces through the wrappers' calls, and a cache filled on a first call under it changes
# what the trace's guards read ("Guard failed on the same frame it was created")
_ENVIRON_KEYS = {name: os.fsencode(name) for name in
                 ("TRITON_INTERPRET", "FLA_INTERPRETER_BF16", "FLA_TARGET_ARCH", "TRITON_OVERRIDE_ARCH")}


def environ(name: str) -> str | None:
    """``os.environ.get(name)``, cheaper (``_ENVIRON_BYTES``)."""
    if _ENVIRON_BYTES is None:
        return os.environ.get(name)
    key = _ENVIRON_KEYS.get(name) or os.fsencode(name)
    value = _ENVIRON_BYTES.get(key)
    return None if value is None else os.fsdecode(value)


def is_interpreter() -> bool:
    return environ("TRITON_INTERPRET") == "1"


def interpreter_dots_bf16() -> bool:
    """Whether ``tl.dot`` of bf16 operands computes what a GPU does: always on a GPU; in the
    interpreter only where ``pytest_fla.targets.interpreter_bf16`` patched it (it sets
    ``FLA_INTERPRETER_BF16=1``), since Triton's own multiplies the operands' bit patterns."""
    return not is_interpreter() or environ("FLA_INTERPRETER_BF16") == "1"


def require_arch(op: str, minimum: int, why: str) -> None:
    """Raise before any launch when the target arch is older than ``minimum``."""
    arch = target_arch()
    if arch < minimum:
        raise NotImplementedError(f"{op}: needs sm{minimum} or newer, the target is sm{arch}: {why}")


SM75_TILES = ("sm75 has 64 KB of shared memory and no bf16 tensor cores, and the chunk "
              "kernels' [64, K] tiles do not fit there")


def target_arch() -> int:
    """The compute capability (e.g. 80, 90) that kernel configs are chosen for."""
    for var in ("FLA_TARGET_ARCH", "TRITON_OVERRIDE_ARCH"):
        value = environ(var)
        if value:
            return parse_arch(value)
    if not is_interpreter() and _cuda_available():
        import torch

        return _device_arch(torch.cuda.current_device())
    return 80


@functools.lru_cache(maxsize=None)
def _cuda_available() -> bool:
    """``torch.cuda.is_available()``, asked once: the device count it reads is fixed for the
    process, and the question itself reads an environment variable on every call."""
    import torch

    return torch.cuda.is_available()


@functools.lru_cache(maxsize=None)
def _device_arch(index: int) -> int:
    """A device's compute capability, asked once: every call's configs read the target, and
    a host-bound op's call pays each microsecond (``kernels/README.md``, "Why the configs are what
    they are")."""
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return major * 10 + minor


def shared_memory_limit(arch: int | None = None) -> int:
    """Opt-in shared memory per block, in bytes, for ``arch`` (default: the target)."""
    return _limit_of(target_arch() if arch is None else arch)


def autotune(configs, key, **kwargs):
    """``triton.autotune`` that keeps only the first config under the interpreter.

    Timing means nothing in the interpreter and each extra config multiplies CPU test
    time, so the first config (the one the kernel would most likely pick) is the one
    checked there. On a GPU every config stays; ones over the target's shared-memory
    budget are dropped by the autotuner itself when they fail with ``OutOfResources``.
    """
    if is_interpreter():
        configs = list(configs)[:1]
    return triton.autotune(configs=list(configs), key=key, **kwargs)
