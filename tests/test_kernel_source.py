"""Rules every kernel in kernels/ keeps so that it builds on each Triton in the tested range
(kernels/README.md, "Triton 3.6 to 3.9"), checked on the source: no block pointers, and
every launch passes ``**COMPILE_OPTIONS`` (or ``**RECURRENT_OPTIONS``: contraction off). (Boolean masks are checked by running: Triton
3.9's interpreter rejects any other mask, and CI runs the kernels under it.)"""

from __future__ import annotations

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def _modules():
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(KERNELS.rglob("*.py"))}


def _jit_functions(modules) -> set[str]:
    return {
        node.name
        for tree in modules.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and any("jit" in ast.unparse(d) or "autotune" in ast.unparse(d) for d in node.decorator_list)
    }


def _stated_options() -> set[str]:
    """The option sets of kernels/_arch.py that state multiply-add contraction."""
    from kernels import _arch

    return {name for name, value in vars(_arch).items()
            if name.endswith("_OPTIONS") and isinstance(value, dict) and "enable_fp_fusion" in value}


def test_every_launch_states_the_compile_options():
    modules = _modules()
    jit = _jit_functions(modules)
    stated = _stated_options()
    assert {"COMPILE_OPTIONS", "RECURRENT_OPTIONS"} <= stated
    launches, missing = 0, []
    for path, tree in modules.items():
        for node in ast.walk(tree):
            # kernel[grid](...)
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in jit):
                continue
            launches += 1
            # **COMPILE_OPTIONS (or another set of _arch's that states contraction), or
            # **launch_options(...), which carries them
            if not any(k.arg is None and (ast.unparse(k.value).split(".")[-1] in stated
                                          or ast.unparse(k.value).startswith("launch_options("))
                       for k in node.keywords):
                missing.append(f"{path.relative_to(KERNELS.parent)}:{node.lineno} {node.func.value.id}")
    assert launches > 20, f"found only {launches} launches: the scan no longer sees them"
    assert not missing, "launches without **COMPILE_OPTIONS or another stated set (kernels/_arch.py):\n" + "\n".join(missing)


def test_no_block_pointers():
    uses = [
        f"{path.relative_to(KERNELS.parent)}:{node.lineno}"
        for path, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("make_block_ptr", "advance")
        and isinstance(node.value, ast.Name) and node.value.id == "tl"
    ]
    assert not uses, "tl.make_block_ptr / tl.advance (removed in Triton 3.9) at:\n" + "\n".join(uses)
