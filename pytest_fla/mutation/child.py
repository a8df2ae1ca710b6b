"""The pytest plugin the mutation command loads into its child runs (``-p
pytest_fla.mutation.child``); it does nothing unless one of its variables is set.

* ``FLA_MUTATION_SITES=PATH`` (with ``--collect-only``): once the session's specs are
  known, run each selected op's cases and write the jit lines they reach
  (``sites.reached_by``) as JSON ``{op: {path: [lines]}}``.
* ``FLA_MUTATION_VERDICT=PATH``: write the first failing test (its id, and whether Triton
  refused the code: :func:`refused_by_triton`) as soon as it fails, and at the end the
  counts, the test running last (a worker killed by a signal leaves it named) and whether ``FLA_MUTATION_FILE`` (the mutated file) was imported at all.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from .. import environment

# Exceptions by which Triton refuses a kernel's code before any value is computed: the
# compiler's (a type, shape or construct error, a failed static assertion, ptxas), and
# the interpreter's wrapper of an error raised while it runs the kernel body, which is
# where the interpreter makes the same type and shape checks.
REFUSALS = ("CompilationError", "CompileTimeAssertionFailure", "UnsupportedLanguageConstruct",
            "PTXASError", "InterpreterError")


# A finding of the interpreter's access check (``pytest_fla.sanitizer.interpreter``), raised
# from inside the interpreter's run of the kernel body: it judges what the code does, as
# memcheck does, not whether Triton takes the code.
FINDINGS = ("OutOfBounds", "UnorderedWrites")


def refused_by_triton(error: BaseException | None) -> str | None:
    """The name of the refusal in ``error``'s chain of causes, or None (also where the
    chain holds a finding of the access check)."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    names = [[cls.__name__ for cls in type(e).__mro__] for e in chain]
    if any(name in FINDINGS for found in names for name in found):
        return None
    for found in names:
        for name in found:
            if name in REFUSALS:
                return name
    return None


def pytest_collection_finish(session):
    out = os.environ.get(environment.MUTATION_SITES)
    if not out:
        return
    import torch

    from ..ops.registry import session_specs
    from .sites import reached_by

    config = session.config
    wanted = os.environ.get(environment.MUTATION_OPS, "")
    device = torch.device(os.environ.get(environment.MUTATION_DEVICE, "cpu"))
    root = Path(os.environ.get(environment.MUTATION_ROOT, config.rootpath))
    specs = [s for s in session_specs(config) if not wanted or s.name in wanted.split(",")]
    found = {}
    for spec in specs:
        found[spec.name] = reached_by(spec, device, root)
        print(f"sites: {spec.name}: {sum(map(len, found[spec.name].values()))} jit lines reached", file=sys.stderr)
    Path(out).write_text(json.dumps(found))


class _Verdict:
    def __init__(self, path: str):
        self.path = Path(path)
        self.first = None
        self.running = None
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}

    def write(self) -> None:
        mutated = os.environ.get(environment.MUTATION_FILE)
        imported = None
        if mutated:
            target = os.path.realpath(mutated)
            imported = any(os.path.realpath(getattr(m, "__file__", None) or "") == target
                           for m in list(sys.modules.values()))
        self.path.write_text(json.dumps({"first_failure": self.first, "running": self.running, "counts": self.counts,
                                         "mutated_file_imported": imported}))

    def pytest_runtest_logstart(self, nodeid, location):
        # written before the test runs: a worker that dies of a signal leaves its test named
        self.running = nodeid.split("::", 1)[-1]
        self.write()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.passed and report.when == "call":
            self.counts["passed"] += 1
        elif report.skipped:
            self.counts["skipped"] += 1
        elif report.failed:
            self.counts["failed"] += 1
            if self.first is None:
                error = call.excinfo.value if call.excinfo is not None else None
                message = str(error).strip().splitlines() if error is not None else []
                self.first = {
                    "test": item.nodeid.split("::", 1)[-1],
                    "when": report.when,
                    "error": type(error).__name__ if error is not None else None,
                    "message": message[0][:300] if message else "",
                    "refused_by": refused_by_triton(error),
                }
                self.write()

    def pytest_sessionfinish(self, session):
        self.write()


def pytest_configure(config):
    path = os.environ.get(environment.MUTATION_VERDICT)
    if path:
        config.pluginmanager.register(_Verdict(path), "fla_mutation_verdict")
