"""Arch targets: which archs a run checks, and in which mode each one runs.

``--fla-arch`` names the targets; the machine decides each target's mode:

========== =====================================================================
native      the target is the GPU's own arch: everything runs on the device
emulated    an Ampere-class target (sm80/86/89) older than the GPU, whose
            shared memory the GPU has at least as much of: Triton generates the
            target's code (``TRITON_OVERRIDE_ARCH``) and the target's
            shared-memory limit is enforced on every kernel
compile     no GPU here can run the target: every kernel config is compiled
            offline for it and checked against its limits
interpreter no GPU at all: numeric checks run on the CPU (``TRITON_INTERPRET=1``)
========== =====================================================================

Each target runs in a process of its own, configured entirely by environment
variables (``target_environment``), so that worker and child processes rebuild the
same target from ``FLA_RUN_TARGET`` alone. This module imports neither torch nor
triton: the GPU is probed through the CUDA driver library directly.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from .. import environment
from .arch_table import ALL_ARCHS, SHARED_MEMORY_LIMIT, arch_name
from .arch_table import parse_known_arch as parse_arch

# Targets that TRITON_OVERRIDE_ARCH was checked to produce working code for on a newer GPU.
EMULATABLE = (80, 86, 89)

NATIVE = "native"
EMULATED = "emulated"
COMPILE_ONLY = "compile-only"
INTERPRETER = "interpreter"
# What each mode can do: run kernels (numeric checks), and compile them offline.
RUNS_KERNELS = {NATIVE: True, EMULATED: True, COMPILE_ONLY: False, INTERPRETER: True}
COMPILES = {NATIVE: True, EMULATED: True, COMPILE_ONLY: True, INTERPRETER: False}

@dataclass(frozen=True)
class Target:
    """One arch target of a run: its name (``sm80``, or ``interpreter``), arch and mode."""

    name: str
    arch: int | None  # None: the interpreter, which targets no arch
    mode: str
    reason: str

    def encode(self) -> str:
        return f"{self.name}:{self.mode}"


@dataclass(frozen=True)
class Gpu:
    count: int
    arch: int  # the first visible device's compute capability, e.g. 90


def probe_gpu() -> Gpu | None:
    """The visible GPUs, read from the CUDA driver (no CUDA context is created)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return None
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, 0)  # COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, 0)  # COMPUTE_CAPABILITY_MINOR
    return Gpu(count.value, major.value * 10 + minor.value)


def choose_mode(arch: int, gpu: Gpu | None) -> tuple[str, str]:
    """The mode for target ``arch`` on a machine with ``gpu``, and why."""
    target = arch_name(arch)
    if gpu is None:
        return COMPILE_ONLY, f"no GPU here: {target} kernels are compiled offline and checked"
    here = arch_name(gpu.arch)
    if arch == gpu.arch:
        return NATIVE, f"the GPU is {here}"
    gpu_shared = SHARED_MEMORY_LIMIT.get(gpu.arch, 0)
    if arch in EMULATABLE and arch < gpu.arch and gpu_shared >= SHARED_MEMORY_LIMIT[arch]:
        return EMULATED, (
            f"{here} runs {target} code (TRITON_OVERRIDE_ARCH={target}) "
            f"within {target}'s {SHARED_MEMORY_LIMIT[arch]} bytes of shared memory"
        )
    return COMPILE_ONLY, f"the {here} GPU cannot run {target} code: compiled offline and checked"


def resolve_targets(spec: str, gpu: Gpu | None) -> list[Target]:
    """``--fla-arch`` -> the run's targets, in order, each with its mode and reason.

    Without a GPU the numeric checks still run once, under the interpreter, beside
    the compile-only targets.
    """
    words = arch_words(spec)
    archs: list[int] = []
    native = False
    for word in words:
        if word == "native":
            native = True
        elif word == "all":
            archs.extend(ALL_ARCHS)
        else:
            archs.append(parse_arch(word))
    if not words:
        native = True
    if native and gpu is not None:
        archs.insert(0, gpu.arch)
    targets = []
    for arch in dict.fromkeys(archs):
        mode, reason = choose_mode(arch, gpu)
        targets.append(Target(arch_name(arch), arch, mode, reason))
    if gpu is None:
        reason = "no GPU here: numeric checks run on the CPU under TRITON_INTERPRET=1"
        targets.insert(0, Target(INTERPRETER, None, INTERPRETER, reason))
    return targets


def decode_target(text: str) -> Target:
    name, _, mode = text.partition(":")
    arch = None if name == INTERPRETER else parse_arch(name)
    return Target(name, arch, mode, f"set by {environment.RUN_TARGET}")


def current_target() -> Target | None:
    """The target this process runs, as its coordinator set it in the environment (None
    outside a run): for what runs before the session is configured (a worker's setup,
    before torch is imported) or outside one (a reproducer). Elsewhere ``run_target``."""
    text = os.environ.get(environment.RUN_TARGET)
    return decode_target(text) if text else None


# the run's state holds this process's target from its first hook on (plugin.py)
RUN_TARGET = pytest.StashKey["Target | None"]()


def run_target(config) -> Target | None:
    """The target this process runs tests under, from the run's state."""
    return config.stash.get(RUN_TARGET, None)


def arch_words(option: str) -> list[str]:
    """``--fla-arch``'s words, lower case, in order: the one place the option is split."""
    return [word.strip().lower() for word in option.split(",") if word.strip()]


def triton_cache_dir(target: Target) -> str:
    """A Triton cache directory of the target's own, beside the default cache."""
    base = os.environ.get(environment.TRITON_CACHE_BASE) or os.path.join(Path.home(), ".triton", "cache")
    return os.path.join(base, f"fla-{target.name}")


def target_environment(target: Target) -> dict[str, str]:
    """Variables that make a fresh process run ``target``.

    Set before torch or triton are imported: ``TRITON_INTERPRET`` decides what
    ``@triton.jit`` builds at import time. An empty value reads as unset to Triton
    and to ``kernels._arch``; for ``CUDA_VISIBLE_DEVICES`` it hides every GPU.
    """
    env = {
        environment.RUN_TARGET: target.encode(),
        environment.TARGET_ARCH: arch_name(target.arch) if target.arch else "",
        "TRITON_INTERPRET": "1" if target.mode == INTERPRETER else "",
        "TRITON_OVERRIDE_ARCH": arch_name(target.arch) if target.mode == EMULATED else "",
        "TRITON_CACHE_DIR": triton_cache_dir(target),
    }
    if target.mode == COMPILE_ONLY:
        env["CUDA_VISIBLE_DEVICES"] = ""  # compile-only never touches a GPU
    return env


def apply_environment(env: dict[str, str]) -> None:
    os.environ.update(env)
