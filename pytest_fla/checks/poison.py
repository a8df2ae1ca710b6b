"""NaN-poisoning of a library's own allocations: an output element a kernel never wrote
stays NaN (-1 for integers), where fresh memory would pass for a plausible value.

What gets poisoned is the ini option ``fla_poison`` (one target per line):

* ``package.module:FLAG``: a boolean the library's allocation helper reads (this repo's
  ``kernels._utils:POISON_ALLOCATIONS``, read by ``kernels._utils.empty``); it is set
  True while a test of an op runs;
* ``torch`` (the default): ``torch.empty``, ``torch.empty_like`` and
  ``Tensor.new_empty`` fill what they return, for a library without such a flag.

The plugin's autouse fixture ``fla_poison_allocations`` poisons during every test of an
op (``fla_op`` marker); ``test_every_output_written`` relies on it.
"""

from __future__ import annotations

import contextlib
import importlib
import sys

INI = "fla_poison"
DEFAULT_TARGETS = ("torch",)
TORCH = "torch"

_targets: tuple[str, ...] = DEFAULT_TARGETS


def configure(targets) -> None:
    """Set the session's targets (the plugin does, from the ini option); checks each."""
    global _targets
    targets = tuple(t.strip() for t in targets if t.strip())
    for target in targets:
        if target != TORCH and (":" not in target or not all(target.split(":"))):
            raise ValueError(f"{INI}: {target!r} is neither `torch` nor `package.module:FLAG`")
    _targets = targets


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
                    stack.enter_context(_poisoned_torch())
                continue
            module_name, flag = target.split(":")
            module = sys.modules.get(module_name)
            if module is None and op_test:
                module = importlib.import_module(module_name)
            if module is not None:
                stack.enter_context(_flag_set(module, flag))
        yield


@contextlib.contextmanager
def _flag_set(module, flag: str):
    saved = getattr(module, flag)
    setattr(module, flag, True)
    try:
        yield
    finally:
        setattr(module, flag, saved)


def fill_poison(t):
    if t.device.type != "meta" and t.numel():
        t.fill_(float("nan") if (t.dtype.is_floating_point or t.dtype.is_complex) else -1)
    return t


@contextlib.contextmanager
def _poisoned_torch():
    import torch

    empty, empty_like, new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def poisoned_empty(*args, **kwargs):
        return fill_poison(empty(*args, **kwargs))

    def poisoned_empty_like(*args, **kwargs):
        return fill_poison(empty_like(*args, **kwargs))

    def poisoned_new_empty(self, *args, **kwargs):
        return fill_poison(new_empty(self, *args, **kwargs))

    torch.empty, torch.empty_like, torch.Tensor.new_empty = poisoned_empty, poisoned_empty_like, poisoned_new_empty
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = empty, empty_like, new_empty
