"""Mutation testing of an op's checks: ``python -m pytest_fla mutate`` (:mod:`.command`).

:mod:`.operators` edits a ``@triton.jit`` function's source; :mod:`.sites` finds the
kernel code an op runs and lists its mutants; :mod:`.plan` selects them and reads the
kept list of equivalent ones; :mod:`.runner` runs the op's checks on one mutant in a
private copy of the project; :mod:`.child` is the pytest plugin of those runs;
:mod:`.report` prints and writes the outcome.
"""
