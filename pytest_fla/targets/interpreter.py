"""Triton's interpreter without its repeated patching of ``triton.language``.

Under ``TRITON_INTERPRET=1`` a kernel launch replaces the builtins of ``triton.language``
(every ``tl.*`` function and ``tl.tensor`` method) with interpreted ones for the launch,
and puts them back after it. Each call of a ``@triton.jit`` helper from inside the kernel
replaces them all again, although the launch's replacements are still in force: Triton
3.6 to 3.9 list every member of ``tl``, ``tl.math`` and ``tl.tensor`` (``inspect.getmembers``)
at each helper call. Kernels built from helpers call them per program and per loop step;
on this repository's conformance checks that was a third of the interpreter's time.

``skip_repeated_patching()`` makes a helper call inside a launch reuse the launch's
replacements when they cover the modules the helper sees (the same ones, installed by
the same code): the launch's own, and those of an earlier helper call in it, which Triton
never puts back. The launch itself, and the first helper call that sees a module not yet
patched in it, go through Triton's own code. ``FLA_INTERPRETER_REPATCH=1`` turns this off.
"""

from __future__ import annotations

import os

from .. import environment


# A pytest ``filterwarnings`` entry for the one warning the interpreter itself causes: its
# ``tl.tensor.__index__`` (a loop bound, ``range(n)`` over a kernel argument) is
# ``int(self.handle.data)`` of a one-element array, which numpy >= 1.25 deprecates (139 in the
# example package's checks alone). The warning names Triton's module, not the kernel, and no
# kernel can avoid it; the same deprecation raised from any other module still shows.
NUMPY_SCALAR_WARNING = ("ignore:Conversion of an array with ndim > 0 to a scalar is deprecated"
                        ":DeprecationWarning:triton\\.runtime\\.interpreter")


def wanted() -> bool:
    """Whether the shortcut is to be installed (``FLA_INTERPRETER_REPATCH=1`` says no)."""
    return os.environ.get(environment.INTERPRETER_REPATCH) != "1"


def skip_repeated_patching() -> bool:
    """Install the shortcut in this process; False (nothing done) where it is not wanted or
    this Triton's interpreter has not the shape it was written for."""
    if not wanted():
        return False
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    empty_scope = getattr(interpreter, "_LangPatchScope", None)
    if None in (original, executor, empty_scope) or getattr(original, "fla_shortcut", False):
        return False
    import triton.language as tl

    launches: list[list] = []  # per launch in progress: [its kernel, the modules it patched]
    launch = executor.__call__

    def launch_tracked(self, *args, **kwargs):
        launches.append([getattr(self, "fn", None), None])
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.pop()

    def patch_lang(fn):
        seen = frozenset(id(value) for value in fn.__globals__.values() if value is tl or value is tl.core)
        current = launches[-1] if launches else None
        if current is not None and current[1] is not None and seen <= current[1]:
            return empty_scope()  # in force already: nothing to patch or restore
        scope = original(fn)
        if current is not None and current[1] is None and fn is current[0]:
            current[1] = seen  # the launch's own replacements, put back when it ends
        elif current is not None and current[1] is not None:
            # A helper's replacements are never put back (Triton drops its scope), so they
            # too stay in force to the launch's end: Triton's own tl.sum, tl.zeros, tl.cdiv
            # see triton.language.core, which the launch of a kernel that sees only tl
            # leaves alone.
            current[1] = current[1] | seen
        return scope

    patch_lang.fla_shortcut = True
    interpreter._patch_lang = patch_lang
    executor.__call__ = launch_tracked
    return True

