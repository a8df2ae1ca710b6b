"""The switches a kernel library offers the checks, named in the ini (``docs/plugin-api.md``,
"Your library's switches"): the plugin never imports a library's internals, it sets what the
library names.

==========================  ==================================================================
``fla_poison``              allocations filled with NaN during op tests (``checks.poison``)
``fla_zero_allocations``    allocations started at zero while opcheck runs: ``torch`` (the
                            default: ``torch.empty`` and friends) or ``package.module:FLAG``
``fla_capturing_launches``  ``package.module:FLAG`` set True while launches are captured for an
                            offline compile (``checks.capture``): the library's wrappers then
                            accept CPU tensors, whose launches are recorded and never run
``fla_clear_caches``        ``package.module:function`` called before the CUDA-graph check, to
                            empty what the library caches on the device between calls
``fla_through_custom_ops``  ``package.module:FLAG`` set True while opcheck records the custom
                            ops a call reaches: a library whose eager path skips the dispatcher
                            (for host time) routes its calls through its custom ops then
==========================  ==================================================================

A ``FLAG`` is a module-level boolean the library reads on every call; the plugin sets it
True inside the block and restores it after.

The session's switches reach the processes it starts outside pytest (a reproducer runs as a
plain script) through ``FLA_LIBRARY_SWITCHES``; a script of the library's own that captures
launches without a session reads them from its ``pyproject.toml`` (``configure_from_pyproject``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys

from .. import environment

TORCH = "torch"
ZERO_ALLOCATIONS = "fla_zero_allocations"
CAPTURING_LAUNCHES = "fla_capturing_launches"
CLEAR_CACHES = "fla_clear_caches"
THROUGH_CUSTOM_OPS = "fla_through_custom_ops"

# ini name -> (default, whether ``torch`` is a valid entry, what an entry names)
OPTIONS = {
    ZERO_ALLOCATIONS: ((TORCH,), True, "FLAG"),
    CAPTURING_LAUNCHES: ((), False, "FLAG"),
    CLEAR_CACHES: ((), False, "function"),
    THROUGH_CUSTOM_OPS: ((), False, "FLAG"),
}
HELP = {
    ZERO_ALLOCATIONS: "allocations started at zero while opcheck runs: `torch` (torch.empty and friends, "
    "the default) or `package.module:FLAG` flags the library's allocation helper reads",
    CAPTURING_LAUNCHES: "`package.module:FLAG` flags set True while kernel launches are captured for an "
    "offline compile (the library's wrappers then accept CPU tensors)",
    CLEAR_CACHES: "`package.module:function` called before the CUDA-graph check, emptying what the "
    "library caches on the device",
    THROUGH_CUSTOM_OPS: "`package.module:FLAG` flags set True while opcheck records the custom ops a call "
    "reaches (for a library whose eager path skips the dispatcher)",
}


_configured: dict[str, tuple[str, ...]] = {name: default for name, (default, _, _) in OPTIONS.items()}
_configured.update({name: tuple(value)
                    for name, value in json.loads(os.environ.get(environment.LIBRARY_SWITCHES) or "{}").items()
                    if name in OPTIONS})


def parse(ini: str, entries, torch_allowed: bool, names: str = "FLAG") -> tuple[str, ...]:
    """The ini option's entries, each checked: ``torch`` (where allowed) or ``package.module:NAME``."""
    entries = tuple(e.strip() for e in entries if e.strip())
    for entry in entries:
        if entry == TORCH and torch_allowed:
            continue
        if ":" not in entry or not all(entry.split(":")):
            expected = f"`torch` nor `package.module:{names}`" if torch_allowed else f"`package.module:{names}`"
            raise ValueError(f"{ini}: {entry!r} is {'neither ' if torch_allowed else 'not '}{expected}")
    return entries


def configure(ini: str, entries) -> None:
    """Set the session's entries of one option (the plugin does, from the ini)."""
    _, torch_allowed, names = OPTIONS[ini]
    _configured[ini] = parse(ini, entries, torch_allowed, names)


def configure_from(config) -> None:
    """The session's switches, from its ini; handed on to the processes it starts."""
    for ini in OPTIONS:
        configure(ini, config.getini(ini))
    export()


def export() -> None:
    """Hand the switches configured now to the processes this one starts."""
    os.environ[environment.LIBRARY_SWITCHES] = json.dumps(_configured)


def configure_from_pyproject(path) -> None:
    """The switches a ``pyproject.toml``'s ``[tool.pytest.ini_options]`` names, for a
    script that runs a check's machinery without a pytest session."""
    import tomllib

    with open(path, "rb") as file:
        options = tomllib.load(file).get("tool", {}).get("pytest", {}).get("ini_options", {})
    for ini in OPTIONS:
        if ini in options:
            configure(ini, options[ini])


def entries(ini: str) -> tuple[str, ...]:
    return _configured[ini]


def resolve(entry: str, import_it: bool = True):
    """``(module, name)`` of a ``package.module:NAME`` entry; the module is ``None`` when it
    is not imported yet and ``import_it`` is False."""
    module_name, name = entry.split(":")
    module = sys.modules.get(module_name)
    if module is None and import_it:
        module = importlib.import_module(module_name)
    return module, name


@contextlib.contextmanager
def flag_set(module, flag: str):
    saved = getattr(module, flag)
    setattr(module, flag, True)
    try:
        yield
    finally:
        setattr(module, flag, saved)


@contextlib.contextmanager
def flags_set(ini: str):
    """Every ``package.module:FLAG`` of ``ini`` True inside the block."""
    with contextlib.ExitStack() as stack:
        for entry in entries(ini):
            if entry != TORCH:
                stack.enter_context(flag_set(*resolve(entry)))
        yield


def call_each(ini: str) -> None:
    """Call every ``package.module:function`` of ``ini``."""
    for entry in entries(ini):
        module, name = resolve(entry)
        getattr(module, name)()
