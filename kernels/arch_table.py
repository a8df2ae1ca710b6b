"""The GPU archs the kernels know, and what each allows: one table for ``kernels._arch``
(configs per target) and for the plugin (arch targets, compile checks, emulation).

Plain data, no imports beyond the standard library: the plugin loads this file by path
(``pytest_fla.targets``) before torch or triton may be imported, without running
``kernels/__init__.py``.
"""

from __future__ import annotations

import re

# Per-block opt-in shared memory in bytes (CUDA programming guide, compute capability tables).
SHARED_MEMORY_LIMIT = {
    75: 65536,
    80: 166912,
    86: 101376,
    89: 101376,
    90: 232448,
    100: 232448,
    120: 101376,
}
ALL_ARCHS = tuple(sorted(SHARED_MEMORY_LIMIT))

_ARCH_RE = re.compile(r"^(?:sm_?)?(\d{2,3})a?$")


def arch_name(arch: int) -> str:
    return f"sm{arch}"


def parse_arch(text: str | int) -> int:
    """``'sm80'``, ``'sm_90a'``, ``'90'`` or ``90`` -> the capability as an integer (90)."""
    if isinstance(text, int):
        return text
    match = _ARCH_RE.match(text.strip().lower())
    if match is None:
        raise ValueError(f"cannot parse GPU arch {text!r}: expected e.g. 'sm80' or 'sm90'")
    return int(match.group(1))


def parse_known_arch(text: str) -> int:
    """``parse_arch`` for an arch in the table (a target must have a known budget)."""
    try:
        arch = parse_arch(text)
    except ValueError:
        arch = None
    if arch not in SHARED_MEMORY_LIMIT:
        known = ", ".join(arch_name(a) for a in ALL_ARCHS)
        raise ValueError(f"unknown GPU arch {text!r}: expected native, all, or a list of {known}")
    return arch


def shared_memory_limit(arch: int) -> int:
    """Opt-in shared memory per block of ``arch``; an arch not in the table gets the
    nearest older one's."""
    if arch in SHARED_MEMORY_LIMIT:
        return SHARED_MEMORY_LIMIT[arch]
    older = [a for a in ALL_ARCHS if a <= arch]
    return SHARED_MEMORY_LIMIT[older[-1] if older else ALL_ARCHS[0]]
