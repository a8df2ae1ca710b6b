"""Which ops' tests a change needs: changed files -> the ops whose kernels they touch.

An op's kernels are found by running it: each spec's op runs forward and backward under
launch capture (CPU tensors, nothing compiled), and the source files of every kernel it
launched, plus the module of its entry point, are the op's files. A change to one of
them selects the op; a change to shared code (``kernels/_*.py``, ``kernels/__init__.py``,
the plugin, the conformance tests, packaging) selects every op; a change elsewhere
(docs, benchmarks) selects none.

Prints one line for pytest: ``--fla-ops=a,b`` , ``all`` or ``none``.

    python ci/select_tests.py --base origin/main            # diff against a base
    python ci/select_tests.py kernels/simple_gla/chunk.py   # or name the files
"""

from __future__ import annotations

import argparse
import inspect
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # specs/ and kernels/ come from the checkout, not the installed plugin
SHARED = ("kernels/_", "kernels/__init__.py", "pytest_fla/", "specs/", "tests/test_", "conftest.py", "pyproject.toml", "reference/__init__.py")


def changed_files(base: str) -> list[str]:
    out = subprocess.run(["git", "diff", "--name-only", f"{base}...HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line]


def op_files(arch: int = 90) -> dict[str, set[str]]:
    """op name -> repo-relative source files of the kernels it launches (and its entry point)."""
    os.environ.pop("TRITON_INTERPRET", None)
    from pytest_fla.checks import switches
    from pytest_fla.checks.compile_per_arch import capture_op
    from specs import all_specs

    switches.configure_from_pyproject(ROOT / "pyproject.toml")  # the kernels' capture flag

    files: dict[str, set[str]] = {}
    for spec in all_specs():
        # The family's own folders always count, also when the op cannot run here.
        found = {f"kernels/{spec.family}/", f"reference/{spec.family}"}
        try:
            for direction in ("fwd", "bwd"):
                if direction == "bwd" and not spec.grads:
                    continue
                found |= {inspect.getsourcefile(launch.kernel.fn) for launch in capture_op(spec, arch, direction, dtypes=("fp32",))}
            found |= {inspect.getsourcefile(inspect.unwrap(fn)) for fn in (spec.op_fn, spec.reference_fn)}
        except Exception as error:  # noqa: BLE001 - fall back to the family's folders
            print(f"select_tests: could not run {spec.name} under capture ({error}); using its family's folders", file=sys.stderr)
        files[spec.name] = {_relative(f) for f in found if f}
    return files


def _relative(path: str) -> str:
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path


def select(changed: list[str], files_of=op_files) -> str:
    """``files_of()`` maps each op to its files (and folder prefixes); called only when needed."""
    if any(path.startswith(SHARED) for path in changed):
        return "all"
    if not any(path.startswith(("kernels/", "reference/", "tests/repro/")) for path in changed):
        return "none"
    touched = files_of()
    ops = sorted(op for op, files in touched.items() if any(path.startswith(tuple(files)) for path in changed))
    repro = any(path.startswith("tests/repro/") for path in changed)
    if repro and not ops:
        return "repro"
    return f"--fla-ops={','.join(ops)}" if ops else "none"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="changed files (default: git diff against --base)")
    parser.add_argument("--base", default="origin/main")
    args = parser.parse_args()
    changed = args.files or changed_files(args.base)
    print(select(changed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
