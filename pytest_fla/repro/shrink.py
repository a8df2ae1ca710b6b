"""A failing numeric check saved as a reproducer, shrunk over its dims first.

With ``--fla-repro-dir=DIR``, a ``test_forward`` or ``test_backward`` whose failure is a
defect (``pytest_fla.report.verdicts``) is run again in its process at smaller sizes,
one dim at a time, each as small as it can go while the check still fails (as hypothesis
shrinks a falsifying example); the smallest call is written to ``DIR/<op>_<check>_<case>.py``
in the reproducer form (``python -m pytest_fla new-repro``), which
``python -m pytest_fla run-repro`` and any ``repro`` folder run. The script asks the
project's own ``pytest_fla_specs`` hooks for the spec (:func:`rerun_check`), so it is the
check itself, at those dims and that seed, that decides.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path

SHRINKABLE = ("forward", "backward")
BUDGET_SECONDS = 60.0  # a shrink stops trying smaller dims past this, and keeps what it has


def run_check(spec, check: str, case, dtype: str, device, refusals_pass: bool = True) -> BaseException | None:
    """What ``check`` raises on ``spec`` at ``case`` (None: it passes), with the test's seed;
    an error other than the check's own assertion counts as passing where ``refusals_pass``
    (a size the op refuses is no smaller failure), and is raised otherwise."""
    from ..checks import generic

    try:
        if check == "forward":
            generic.check_forward(spec, case, dtype, device, generic.seed_for(spec.name, dtype, case.name))
        else:
            seed = generic.seed_for("backward", spec.name, dtype, case.name)
            generic.check_backward(spec, spec.sample(case, dtype, device, seed), dtype, seed)
    except AssertionError as failure:
        return failure
    except Exception:  # noqa: BLE001 - a size the op refuses is no smaller failure
        if refusals_pass:
            return None
        raise
    return None


def shrink(spec, check: str, case, dtype: str, device, budget: float = BUDGET_SECONDS):
    """``case`` at the smallest dims (each lowered in turn, by bisection toward 1) at which
    ``check`` still fails; and the number of runs it took."""
    dims = dict(case.dims_for(device))
    started, runs = time.monotonic(), 0

    def fails(candidate: dict) -> bool:
        nonlocal runs
        runs += 1
        trial = dataclasses.replace(case, dims=candidate, gpu_dims=None)
        return run_check(spec, check, trial, dtype, device) is not None

    for name in sorted(dims):
        low, high = 1, dims[name]  # high still fails; find the least value that does
        while low < high and time.monotonic() - started < budget:
            middle = (low + high) // 2
            if fails({**dims, name: middle}):
                high = middle
            else:
                low = middle + 1
        dims[name] = high
    return dataclasses.replace(case, dims=dims, gpu_dims=None), runs


TEMPLATE = '''\
# source: pytest-fla, {nodeid} failed ({why}); shrunk in {runs} runs from {before}
# seen-on: {arch}
# expect: pass
# op: {op}
# needs: device
"""{message}"""

from pathlib import Path

from pytest_fla.repro_helpers import rerun_check

rerun_check({op!r}, {check!r}, {dtype!r}, case={case!r}, dims={dims!r}, dist={dist!r}, options={options!r},
            impl={impl!r}, root=Path(__file__).resolve().parent / {root!r})
'''


def write(directory: str, item, spec, check: str, case, small, dtype: str, runs: int, failure: str) -> Path:
    from .. import targets

    target = targets.run_target(item.config)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (re.sub(r"[^A-Za-z0-9_]", "_", f"{spec.name}_{check}_{dtype}_{case.name}") + ".py")
    config = item.config
    text = TEMPLATE.format(
        nodeid=item.nodeid, why=failure.splitlines()[0][:160].replace('"', "'"), runs=runs,
        before=" ".join(f"{k}={v}" for k, v in sorted(case.dims_for(_device(target)).items())),
        arch=target.name if target else "unknown", op=spec.name, check=check, dtype=dtype, case=case.name,
        dims=dict(small.dims), dist=case.dist, options=dict(case.options), impl=config.getoption("fla_impl", None),
        root=os.path.relpath(config.rootpath, folder.resolve()),
        message="\n".join(line.rstrip() for line in failure.strip().replace('"""', "'''").splitlines()[:12]),
    )
    path.write_text(text)
    return path


def _device(target) -> str:
    from .. import targets

    return "cuda" if target is not None and target.mode in (targets.NATIVE, targets.EMULATED) else "cpu"


def save(item, failure: str) -> Path | None:
    """Shrink and write ``item``'s failing check (a forward or backward test of a spec's
    case) to ``--fla-repro-dir``; None where the test is not such a check."""
    directory = item.config.getoption("fla_repro_dir", None)
    callspec = getattr(item, "callspec", None)
    check = getattr(item, "originalname", "").removeprefix("test_")
    if not directory or callspec is None or check not in SHRINKABLE:
        return None
    spec, dtype, case = (callspec.params.get(name) for name in ("spec", "dtype", "case"))
    if spec is None or case is None or dtype is None:
        return None
    from .. import targets

    try:
        if eval(repr(dict(case.options))) != dict(case.options):  # noqa: S307 - our own repr, read back
            return None
    except Exception:  # noqa: BLE001 - an option a script cannot spell (a tensor, a function)
        return None
    device = _device(targets.run_target(item.config))
    small, runs = shrink(spec, check, case, dtype, device)
    return write(directory, item, spec, check, case, small, dtype, runs, failure)


class _Options:
    """What a project's ``pytest_fla_specs`` hook may ask of its config, outside a session."""

    def __init__(self, impl):
        self.impl = impl


def rerun_check(op: str, check: str, dtype: str, *, case: str, dims: dict, dist: str = "realistic",
                options: dict | None = None, impl: str | None = None, root=None) -> None:
    """Run ``check`` of ``op`` at ``dims`` (the case's name keeps its seed): the spec as the
    project's ``pytest_fla_specs`` hooks give it, collected by pytest in ``root``."""
    import pytest

    from ..ops.registry import by_name
    from ..ops.spec import Case
    from .session import session_device

    found = {}

    class Grab:
        @pytest.hookimpl(trylast=True)
        def pytest_collection_finish(self, session):
            found.update(by_name(session.config))

    args = ["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(root or ".")]
    if impl:
        args.append(f"--fla-impl={impl}")
    pytest.main(args, plugins=[Grab()])
    if op not in found:
        raise LookupError(f"no spec named {op!r} in the project at {root}")
    spec = found[op]
    trial = Case(case, dict(dims), dist=dist, options=dict(options or {}))
    failure = run_check(spec, check, trial, dtype, session_device(), refusals_pass=False)
    if failure is not None:
        raise failure
