"""Valid kernels that the interpreter of one Triton in the plugin's range fails, made to run
on each.

A kernel's run under ``TRITON_INTERPRET=1`` must not depend on which Triton of the range
(``pyproject.toml``: 3.6 to 3.9) is installed. Three kinds of a user's ordinary kernel
failed on some of them (``tests/plugin/test_interpreter_versions.py`` runs each on every
Triton):

* **A block mask and'ed with a scalar comparison** (``(cols < 3) & (pid > tl.load(cu))``),
  or a scalar mask on a block of pointers. The interpreter keeps a comparison's numpy bools
  under its operands' type (int32), and broadcasting the scalar to the block (a splat) then
  makes int32 zeros and ones of it. Triton 3.6 to 3.8 load, store and add atomically under
  any integer mask, nonzero as true; 3.9 rejects it: ``ValueError('mask has unsupported
  dtype')``. :func:`fix_int1_splats` makes the splat of an int1 value numpy bools, nonzero
  as true, as the older interpreters read it.
* **A bool argument** (``kernel[grid](x, flag=True)`` with ``flag`` not constexpr). Triton
  3.6 and 3.7 hand it to the kernel as a 32-bit integer typed int1, which their own check
  rejects at launch (``numpy data itemsize (32 bits) exceeds dtype primitive_bitwidth (1
  bits)``); 3.8 and 3.9 hand a numpy bool. :func:`fix_bool_arguments` does as 3.9.
* **A scalar as a loop bound or an index** (``for i in range(tl.cdiv(T, BT).to(tl.int32))``)
  under numpy 2.4 or later (the plugin's requirement is any numpy). Triton 3.6 converts the
  scalar with ``int()`` of its one-element array, which numpy 2.4 refuses (``only
  0-dimensional arrays can be converted to Python scalars``); 3.7 and later take its one
  element.
  :func:`fix_scalar_index` does as 3.7.

Each is installed only where a probe of this process's interpreter shows the failure (the
mask fix on 3.9, the argument fix on 3.6 and 3.7, the index fix on 3.6 with numpy 2.4), so
that an interpreter that runs the kernel is left as it is. One difference is not patched:
Triton 3.9 removed block pointers (``tl.make_block_ptr`` raises, ``tl.advance`` is gone)
from the language, on a GPU as in the interpreter, so a kernel that uses them is not valid
on 3.9; the interpreter fails it with Triton's own plain message, "Block pointers have been
removed in favor of the tensor descriptor API". Passing it in the interpreter would hide a
kernel that cannot compile.
"""

from __future__ import annotations

MASK_FIX = "masks broadcast from a scalar comparison"
ARGUMENT_FIX = "bool arguments"
INDEX_FIX = "scalars as loop bounds under numpy >= 2.4"


def _interpreter():
    try:
        from triton.runtime import interpreter
    except ImportError:
        return None
    return interpreter


def rejects_integer_masks() -> bool:
    """Whether this interpreter's loads refuse a mask held as integers (Triton 3.9's)."""
    interpreter = _interpreter()
    native = getattr(interpreter, "_interpreter", None)
    if native is None or not hasattr(native, "load"):
        return False
    import numpy as np

    value = np.ones(1, dtype=np.float32)
    addresses = np.array([value.ctypes.data], dtype=np.uint64)
    try:
        native.load(addresses, np.ones(1, dtype=np.int32), np.zeros(1, dtype=np.float32), np.dtype(np.float32))
    except ValueError:
        return True
    return False


def rejects_bool_arguments() -> bool:
    """Whether this interpreter's launch refuses a bool argument (Triton 3.6's and 3.7's)."""
    convert = getattr(_interpreter(), "_implicit_cvt", None)
    if convert is None:
        return False
    convert = getattr(convert, "fla_original", convert)  # Triton's own, fixed or not
    try:
        convert(True)
    except ValueError:
        return True
    return False


def rejects_scalar_index() -> bool:
    """Whether this interpreter's scalars refuse to be a loop bound or an index (Triton 3.6's
    under numpy 2.4), tried on a stand-in class so that ``tl.tensor`` is left alone."""
    interpreter = _interpreter()
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    handle = getattr(interpreter, "TensorHandle", None)
    if None in (patch, scope_type, handle):
        return False
    import operator

    import numpy as np
    import triton.language as tl

    patch = getattr(patch, "fla_original", patch)  # Triton's own, fixed or not
    stand_in = type("ScalarStandIn", (), {})
    patch(stand_in, scope_type())
    scalar = stand_in()
    scalar.handle = handle(np.array([3], dtype=np.int32), tl.int32)
    try:
        operator.index(scalar)
    except TypeError:
        return True
    return False


def fix_scalar_index() -> bool:
    """Make the interpreter's scalars give their one element as an index (idempotent); False
    where its shape is not the one this was written for."""
    interpreter = _interpreter()
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return False
    if getattr(original, "fla_scalar_index", False):
        return True

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        # after Triton's own, so that the scope puts Triton's back first, then the original
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_lang_tensor.fla_scalar_index = True
    patch_lang_tensor.fla_original = original
    # a module global: each launch's patching of triton.language looks it up
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


def fix_int1_splats() -> bool:
    """Make the interpreter's splat of an int1 value numpy bools (idempotent); False where its
    shape is not the one this was written for (then nothing is patched)."""
    interpreter = _interpreter()
    builder = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    if builder is None or handle is None or not hasattr(builder, "create_splat"):
        return False
    if getattr(builder.create_splat, "fla_int1_splats", False):
        return True
    import numpy as np
    import triton.language as tl

    original = builder.create_splat

    def create_splat(self, ret_ty, arg):
        splat = original(self, ret_ty, arg)
        if getattr(ret_ty, "scalar", ret_ty) == tl.int1 and splat.data.dtype != np.bool_:
            return handle(splat.data != 0, tl.int1)
        return splat

    create_splat.fla_int1_splats = True
    builder.create_splat = create_splat
    return True


def fix_bool_arguments() -> bool:
    """Hand a launch's bool arguments to the kernel as numpy bools (idempotent); False where
    the interpreter's shape is not the one this was written for."""
    interpreter = _interpreter()
    original = getattr(interpreter, "_implicit_cvt", None)
    handle = getattr(interpreter, "TensorHandle", None)
    if original is None or handle is None:
        return False
    if getattr(original, "fla_bool_arguments", False):
        return True
    import numpy as np
    import triton.language as tl

    def implicit_cvt(arg):
        if isinstance(arg, bool):
            return tl.tensor(handle(np.array([arg], dtype=np.bool_), tl.int1), tl.int1)
        return original(arg)

    implicit_cvt.fla_bool_arguments = True
    implicit_cvt.fla_original = original
    # a module global: the launch (and its tuples' conversion) look it up at each call
    interpreter._implicit_cvt = implicit_cvt
    return True


def needed() -> list[str]:
    """The fixes this process's interpreter needs (the plugin's header names them)."""
    try:
        import numpy  # noqa: F401  (the probes')
    except ImportError:
        return []
    probes = ((MASK_FIX, rejects_integer_masks), (ARGUMENT_FIX, rejects_bool_arguments),
              (INDEX_FIX, rejects_scalar_index))
    return [name for name, probe in probes if probe()]


def install() -> list[str]:
    """Install the fixes this interpreter needs; the names of those installed."""
    fixes = {MASK_FIX: fix_int1_splats, ARGUMENT_FIX: fix_bool_arguments, INDEX_FIX: fix_scalar_index}
    return [name for name in needed() if fixes[name]()]
