"""pytest_fla.compile_lock: two compiles of one kernel source never overlap, two of
different sources do; and the wrapped compile still compiles (offline, for sm90)."""

from __future__ import annotations

import threading
import time

import triton
import triton.language as tl

from pytest_fla import compile_lock


class Source:
    def __init__(self, name):
        self.name = name

    def hash(self):
        return self.name


def _spans(pairs, tmp_path):
    """Run the wrapped compile for each (source name, target) at once, in threads; the
    (start, end) of each compile, in the order of ``pairs``."""
    spans = [None] * len(pairs)

    def slow_compile(src, target=None, options=None):
        start = time.monotonic()
        time.sleep(0.4)
        spans[options] = (start, time.monotonic())

    compile = compile_lock.locked(slow_compile, str(tmp_path / "locks"))
    threads = [threading.Thread(target=compile, args=(Source(name), target, i)) for i, (name, target) in enumerate(pairs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return spans


def _overlap(a, b):
    return a[0] < b[1] and b[0] < a[1]


def test_one_source_compiles_one_at_a_time(tmp_path):
    # flock excludes across open files, so threads of one process exclude each other too
    a, b = _spans([("k", "sm90"), ("k", "sm90")], tmp_path)
    assert not _overlap(a, b)
    assert compile_lock.lock_path(Source("k"), "sm90", "d") != compile_lock.lock_path(Source("k"), "sm80", "d")


def test_different_sources_or_targets_compile_side_by_side(tmp_path):
    a, b = _spans([("k", "sm90"), ("other", "sm90")], tmp_path)
    assert _overlap(a, b)
    a, b = _spans([("k", "sm80"), ("k", "sm90")], tmp_path)
    assert _overlap(a, b)


def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


def test_the_wrapped_compile_compiles_offline(tmp_path, monkeypatch):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    compile = compile_lock.locked(triton.compiler.compile, str(tmp_path / "locks"))
    # a JITFunction itself: under the interpreter @triton.jit would build an interpreted one
    source = ASTSource(JITFunction(add_one), {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 16})
    kernel = compile(source, target=GPUTarget("cuda", 90, 32))
    assert kernel.metadata.name.startswith("add_one")
    assert len(list((tmp_path / "locks").glob("*.lock"))) == 1


def test_launcher_builds_of_one_source_take_turns(tmp_path):
    done = []

    def slow_build(src, name, library_dirs=None):
        start = time.monotonic()
        time.sleep(0.4)
        done.append((src, (start, time.monotonic())))

    build = compile_lock.locked_build(slow_build, str(tmp_path / "locks"))
    threads = [threading.Thread(target=build, args=(src, "launcher")) for src in ("int f;", "int f;", "int g;")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    f_first, f_second = [span for src, span in done if src == "int f;"]
    (g,) = [span for src, span in done if src == "int g;"]
    assert not _overlap(f_first, f_second)
    assert _overlap(g, f_first) or _overlap(g, f_second)
