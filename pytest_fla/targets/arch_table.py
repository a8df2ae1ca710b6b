"""The GPU archs the plugin targets, and the shared memory each allows: the limits that
``--fla-arch`` targets are checked against (compile checks, emulation).

Plain data, no imports beyond the standard library: ``pytest_fla.targets`` reads it before
torch or triton may be imported. A kernel library chooses its configs from budgets of its
own (this repo's: ``kernels/_arch.py``); the plugin holds them to these limits, so a budget
the library got wrong fails a check instead of moving the limit with it.
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
# The card each arch's offline launches stand for, and its SM count: what a library that
# sizes its grid by the GPU (a persistent kernel's programs) reads from Triton's driver,
# answered so where no card of the arch is there (compile-only capture on a CPU machine).
REFERENCE_CARD = {
    75: ("Tesla T4", 40),
    80: ("A100", 108),
    86: ("RTX A6000", 84),
    89: ("L40S", 142),
    90: ("H100 SXM", 132),
    100: ("B200", 148),
    120: ("RTX 5090", 170),
}

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
