"""NaN-poisoning of a library's own allocations: an output element a kernel never wrote
stays NaN (-1 for integers), where fresh memory would pass for a plausible value.

What gets poisoned is the ini option ``fla_poison`` (one target per line):

* ``package.module:FLAG``: a boolean the library's allocation helper reads (this repo's
  pyproject names one); it is set True while a test of an op runs;
* ``torch`` (the default): ``torch.empty``, ``torch.empty_like`` and
  ``Tensor.new_empty`` fill what they return, for a library without such a flag.

The plugin's autouse fixture ``fla_poison_allocations`` poisons during every test of an
op (``fla_op`` marker); ``test_every_output_written`` relies on it.
"""

from __future__ import annotations

import contextlib

from . import switches
from .switches import TORCH

INI = "fla_poison"
DEFAULT_TARGETS = (TORCH,)

_targets: tuple[str, ...] = DEFAULT_TARGETS


def configure(targets) -> None:
    """Set the session's targets (the plugin does, from the ini option); checks each."""
    global _targets
    _targets = switches.parse(INI, targets, torch_allowed=True)


def targets() -> tuple[str, ...]:
    return _targets


@contextlib.contextmanager
def poisoned(targets_: tuple[str, ...] | None = None, op_test: bool = True):
    """Poison the targets' allocations inside the block. Outside a test of an op
    (``op_test=False``) only flags whose module something imported already are set, and
    torch's allocators are left alone (a test that never touches the library imports
    nothing, and pays nothing, for this)."""
    with contextlib.ExitStack() as stack:
        for target in _targets if targets_ is None else targets_:
            if target == TORCH:
                if op_test:
                    stack.enter_context(torch_allocations_filled(fill_poison))
                continue
            module, flag = switches.resolve(target, import_it=op_test)
            if module is not None:
                stack.enter_context(switches.flag_set(module, flag))
        yield


@contextlib.contextmanager
def zeroed():
    """Every allocation of the library starts at zero inside the block (the
    ``fla_zero_allocations`` ini option: torch's allocators, or the library's flags)."""
    with contextlib.ExitStack() as stack:
        if TORCH in switches.entries(switches.ZERO_ALLOCATIONS):
            stack.enter_context(torch_allocations_filled(fill_zero))
        stack.enter_context(switches.flags_set(switches.ZERO_ALLOCATIONS))
        yield


def fill_poison(t):
    if t.device.type != "meta" and t.numel():
        t.fill_(float("nan") if (t.dtype.is_floating_point or t.dtype.is_complex) else -1)
    return t


def fill_zero(t):
    if t.device.type != "meta" and t.numel():
        t.zero_()
    return t


@contextlib.contextmanager
def torch_allocations_filled(fill):
    """``torch.empty``, ``torch.empty_like`` and ``Tensor.new_empty`` pass what they return
    through ``fill`` inside the block."""
    import torch

    empty, empty_like, new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def filled_empty(*args, **kwargs):
        return fill(empty(*args, **kwargs))

    def filled_empty_like(*args, **kwargs):
        return fill(empty_like(*args, **kwargs))

    def filled_new_empty(self, *args, **kwargs):
        return fill(new_empty(self, *args, **kwargs))

    torch.empty, torch.empty_like, torch.Tensor.new_empty = filled_empty, filled_empty_like, filled_new_empty
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = empty, empty_like, new_empty
