"""Which kernel source belongs to an op, and the mutants of it.

An op's kernels are found by running it, not by reading its wrapper: each of its spec's
cases (forward, and backward where it has gradients; and one packed ``cu_seqlens`` sample
where it takes them) runs once while the lines of ``@triton.jit`` code it executes are
recorded. Under the interpreter a kernel is Python run line by line (``sys.settrace``);
compiled natively, Triton's code generator visits the lines it compiles, which are the
branches the launch's constexprs take (``TRITON_ALWAYS_COMPILE=1`` so that a cached
kernel is visited too). Either way helpers count where they are called from, code under
a constexpr branch the op never takes does not, and the same discovery works for any
repository's specs. A site is a mutation of a reached node (:mod:`.operators`).

A mutant's id names the file, the function, the operator, the edit and the edit's
occurrence among equal edits of that function:
``kernels/norm.py::_norm_fwd_kernel::drop_term::ss + eps -> ss#0``. It survives edits of
other functions, and of other lines of the same one, so a kept list of equivalent mutants
stays valid.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from .operators import SourceMap, edits, jit_functions


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str  # relative to the project root, with ``/``
    function: str
    operator: str
    line: int
    start: int
    end: int
    original: str
    replacement: str

    def apply(self, text: str) -> str:
        """``text`` (the file) with this mutation; the span must still hold ``original``."""
        if text[self.start:self.end] != self.original:
            raise ValueError(f"{self.id}: {self.path} changed since its sites were listed")
        return text[:self.start] + self.replacement + text[self.end:]

    def describe(self) -> str:
        return f"{self.path}:{self.line} {self.function} {self.operator} `{_short(self.original)}` -> `{_short(self.replacement)}`"

    def as_dict(self) -> dict:
        return asdict(self)


def _short(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def mutants_of(root: Path, reached: dict[str, set[int]], rewrites: bool = False) -> list[Mutant]:
    """Every mutant (``rewrites``: every rewrite, ``operators.REWRITES``) of the jit
    functions in ``reached`` (relative path -> reached lines), limited to the nodes on
    reached lines, in file and source order."""
    found = []
    for path in sorted(reached):
        lines = reached[path]
        for mutant, first, last in _file_mutants(path, (root / path).read_text(), rewrites):
            if any(line in lines for line in range(first, last + 1)):
                found.append(mutant)
    return found


@functools.lru_cache(maxsize=256)
def _file_mutants(path: str, text: str, rewrites: bool = False) -> tuple:
    """``(mutant, first line, last line)`` for every edit of every jit function of a file
    (kept: the ops of one run share their files)."""
    source = SourceMap(text)
    out = []
    for fn in sorted(jit_functions(ast.parse(text)), key=lambda f: f.lineno):
        seen: dict[tuple, int] = defaultdict(int)
        for edit in edits(fn, source, rewrites):
            key = (edit.operator, " ".join(edit.original.split()), " ".join(edit.replacement.split()))
            occurrence = seen[key]
            seen[key] += 1
            out.append((Mutant(
                id=f"{path}::{fn.name}::{key[0]}::{key[1]} -> {key[2]}#{occurrence}",
                path=path, function=fn.name, operator=edit.operator, line=edit.lines[0],
                start=edit.start, end=edit.end, original=edit.original, replacement=edit.replacement,
            ), *edit.lines))
    return tuple(out)


# ----------------------------------------------------------------------------- in the child


def jit_lines(root: Path, files) -> dict[str, set[int]]:
    """For each project file (relative path), the body lines of its jit functions."""
    out: dict[str, set[int]] = {}
    for path in files:
        tree = ast.parse((root / path).read_text())
        lines = set()
        for fn in jit_functions(tree):
            lines.update(range(fn.body[0].lineno, fn.end_lineno + 1))
        if lines:
            out[path] = lines
    return out


@contextlib.contextmanager
def interpreted_lines(root: Path):
    """Record the lines of project files executed inside the block (``{path: {line}}``,
    absolute paths): under ``TRITON_INTERPRET=1`` the kernels are among them."""
    prefix = str(root.resolve()) + "/"
    hits: dict[str, set[int]] = defaultdict(set)

    def local(frame, event, arg):
        if event == "line":
            hits[frame.f_code.co_filename].add(frame.f_lineno)
        return local

    def on_call(frame, event, arg):
        if frame.f_code.co_filename.startswith(prefix):
            hits[frame.f_code.co_filename].add(frame.f_lineno)
            return local
        return None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield hits
    finally:
        sys.settrace(previous)


@contextlib.contextmanager
def compiled_lines(root: Path):
    """Record the lines of project files Triton's code generator visits inside the block
    (natively compiled kernels: only the branches their constexprs take)."""
    from triton.compiler import code_generator

    prefix = str(root.resolve()) + "/"
    hits: dict[str, set[int]] = defaultdict(set)
    generator = code_generator.CodeGenerator
    original = generator.visit

    def visit(self, node):
        name = self.file_name or ""
        if name.startswith(prefix) and getattr(node, "lineno", None) is not None:
            hits[name].add(self.begin_line + node.lineno)
        return original(self, node)

    generator.visit = visit
    try:
        yield hits
    finally:
        generator.visit = original


def reached_by(spec, device, root: Path) -> dict[str, list[int]]:
    """The jit lines of project files that ``spec``'s cases reach on ``device``
    (relative path -> sorted lines)."""
    import os

    import torch

    from ..checks.generic import differentiable, run_with_grads
    from ..ops.packings import packings
    from ..running.devices import dtype_skip_reason

    recorder = interpreted_lines if os.environ.get("TRITON_INTERPRET") == "1" else compiled_lines
    samples = []
    for case in spec.cases:
        samples.append((case, None, bool(spec.grads) and (case.checks is None or "backward" in case.checks)))
    if spec.varlen:
        edges = next(p for p in packings(spec.chunk_size or 16) if p.name == "chunk_edges")
        samples.append((spec.cases[0], edges.lengths, bool(spec.grads)))
    # fp32, and bf16 where it is checked here (the GPU; the CPU under --fla-bf16-emulated):
    # code under a bf16-only branch (the work dtype's product precision) is reached by it alone
    dtypes = ["fp32"] + (["bf16"] if dtype_skip_reason("bf16", device) is None else [])
    with recorder(root) as hits:
        for case, lengths, backward in samples:
            for dtype in dtypes:
                sample = spec.sample(case, dtype, device, seed=0, lengths=lengths)
                if backward:
                    run_with_grads(spec.op_fn, sample, differentiable(spec, sample))
                else:
                    with torch.no_grad():
                        spec.call(sample)
    resolved = root.resolve()
    relative = {}
    for name, lines in hits.items():
        with contextlib.suppress(ValueError):
            relative[Path(name).resolve().relative_to(resolved).as_posix()] = lines
    body = jit_lines(resolved, [p for p in relative if p.endswith(".py")])
    return {path: sorted(relative[path] & body[path]) for path in body if relative[path] & body[path]}
