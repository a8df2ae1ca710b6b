"""Launch capture and offline compilation: the compile-only checks.

Inside ``capture_launches(arch)`` every ``kernel[grid](...)`` is recorded instead of
run: the kernel, its specialised signature, constexprs, compile options and grid,
bound exactly as Triton would bind them for ``arch``. An autotuned kernel records one
launch per config (heuristics pass through), so every config a card could pick is
checked. The library's ``fla_capturing_launches`` flags (``checks.switches``) are set
meanwhile, so its op wrappers can accept CPU tensors; where no GPU driver is, Triton's
driver answers as the arch's reference card would (``_ArchDriver``: a library that sizes
its grid by the SM count gets that card's). ``check_launches`` then compiles each distinct launch for the target with
``triton.compile(..., target=GPUTarget("cuda", arch, 32))`` and checks what a real card
checks at load and launch: shared memory within the arch's opt-in limit, threads per
block, and the grid within CUDA's limits.

Needs ``TRITON_INTERPRET`` unset in this process: the interpreter replaces
``@triton.jit`` functions at import time.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from . import switches
from ..targets import SHARED_MEMORY_LIMIT, arch_name
from ..targets.arch_table import REFERENCE_CARD

MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_THREADS_PER_BLOCK = 1024


@dataclass
class Launch:
    """One recorded ``kernel[grid](...)`` (one config of it, for an autotuned kernel)."""

    kernel: object  # triton JITFunction
    signature: dict
    constexprs: dict
    attrs: dict
    options: object  # the backend's parsed options (num_warps, num_stages, ...)
    grid: tuple
    label: str = ""  # which case / direction launched it

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    def config(self) -> str:
        consts = ", ".join(
            f"{self.kernel.arg_names[path[0]]}={value}"
            for path, value in self.constexprs.items()
            if len(path) == 1 and not isinstance(value, type(None))
        )
        return f"{consts}, num_warps={self.options.num_warps}, num_stages={self.options.num_stages}"

    def key(self) -> tuple:
        return (
            id(self.kernel),
            repr(sorted(self.signature.items())),
            repr(sorted(self.constexprs.items())),
            repr(sorted(self.attrs.items())),
            repr(sorted(self.options.__dict__.items())),
        )

    def kernel_key(self) -> tuple:
        """The kernel and the element types of its pointers: one of each per dtype an op runs in."""
        pointers = sorted({v for v in self.signature.values() if isinstance(v, str) and v.startswith("*")})
        return (id(self.kernel), tuple(pointers))


@dataclass
class Problem:
    launch: Launch
    what: str

    def __str__(self) -> str:
        where = f" [{self.launch.label}]" if self.launch.label else ""
        return f"{self.launch.name}({self.launch.config()}){where}: {self.what}"


@dataclass
class CompileResult:
    arch: int
    launches: list[Launch]
    compiled: int = 0
    problems: list[Problem] = field(default_factory=list)
    shared: dict = field(default_factory=dict)  # kernel name -> largest shared memory seen

    def summary(self) -> str:
        lines = [f"{arch_name(self.arch)}: {len(self.launches)} launches, {self.compiled} distinct kernels compiled"]
        lines += [f"  {name}: up to {shared} bytes of shared memory" for name, shared in sorted(self.shared.items())]
        return "\n".join(lines)


def _target(arch: int):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", arch, 32)


class _Recorder:
    def __init__(self, arch: int):
        from triton.backends.nvidia.compiler import CUDABackend

        self.backend = CUDABackend(_target(arch))
        self.launches: list[Launch] = []
        self.label = ""
        self._binders: dict = {}

    def record(self, kernel, args, grid, kwargs) -> None:
        from triton import knobs
        from triton.runtime.jit import create_function_from_signature

        kwargs = dict(kwargs)
        kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        binder = self._binders.get(id(kernel))
        if binder is None:
            binder = create_function_from_signature(kernel.signature, kernel.params, self.backend)
            self._binders[id(kernel)] = binder
        bound_args, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(
            self.backend, kwargs, bound_args, specialization, options
        )
        if callable(grid):
            grid = grid(bound_args)
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        self.launches.append(Launch(kernel, signature, constexprs, attrs, options, grid, self.label))


class _ArchDriver:
    """Stands in for Triton's driver while launches are captured where no GPU driver is
    (a CPU machine): the arch's target, device 0, and the properties a library reads to size
    its grid, of the arch's reference card (``REFERENCE_CARD``: SM count; the opt-in shared
    memory of ``SHARED_MEMORY_LIMIT``). Nothing is launched through it; a property it does
    not hold (clock rates) is a KeyError, as for a key the real one lacks."""

    def __init__(self, arch: int):
        self.target = _target(arch)
        self.utils = self
        self.properties = {"max_shared_mem": SHARED_MEMORY_LIMIT[arch], "max_num_regs": 65536,
                           "multiprocessor_count": REFERENCE_CARD[arch][1], "warpSize": 32}

    @staticmethod
    def is_active() -> bool:
        return True

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device) -> None:
        pass

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_device_properties(self, device) -> dict:
        return dict(self.properties)


@contextlib.contextmanager
def _driver_for(arch: int):
    """Triton's driver as it is where one is active (a GPU machine: the real card answers),
    else :class:`_ArchDriver` for ``arch`` meanwhile."""
    from triton.runtime import driver as config

    try:
        config.active
    except RuntimeError:  # "0 active drivers": no GPU here
        if hasattr(config, "set_active") and hasattr(config, "_active"):
            saved = config._active
            config.set_active(_ArchDriver(arch))
            try:
                yield
            finally:
                config._active = saved  # reset_active() would ask for the missing driver again
            return
    yield


@contextlib.contextmanager
def capture_launches(arch: int):
    """Record kernel launches for ``arch`` instead of running them; yields the recorder.

    Set ``recorder.label`` to tag the launches that follow (e.g. ``"bf16 K=128 bwd"``).
    """
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    recorder = _Recorder(arch)

    def record_launch(self, *args, grid, warmup, **kwargs):
        recorder.record(self, args, grid, kwargs)

    def record_every_config(self, *args, **kwargs):
        # Each config as the autotuner would bench it; the last one stands for the pick.
        for config in self.configs:
            self.fn.run(*args, **kwargs, **config.all_kwargs())

    saved = (JITFunction.run, Autotuner.run)
    JITFunction.run, Autotuner.run = record_launch, record_every_config
    try:
        with switches.flags_set(switches.CAPTURING_LAUNCHES), _driver_for(arch):
            yield recorder
    finally:
        JITFunction.run, Autotuner.run = saved


_compiled: dict = {}  # Launch.key() + arch -> compiled kernel or the exception it raised


def compile_launch(launch: Launch, arch: int):
    """Compile one launch for ``arch`` (cached per process, and on disk by Triton)."""
    import triton
    from triton.compiler import ASTSource

    key = launch.key() + (arch,)
    if key not in _compiled:
        source = ASTSource(launch.kernel, launch.signature, launch.constexprs, launch.attrs)
        try:
            _compiled[key] = triton.compile(source, target=_target(arch), options=launch.options.__dict__)
        except Exception as error:  # noqa: BLE001 - reported as the check's finding
            _compiled[key] = error
    return _compiled[key]


def compile_error_text(error: Exception, context_lines: int = 4) -> str:
    """A compiler error on a few lines: its position, the source lines before the caret, and
    the error that caused it (Triton's ``CompilationError`` keeps the real message, such as
    ``Inconsistent return types``, in ``__cause__``; its first line alone says only "at 12:16")."""
    lines = [line.rstrip() for line in str(error).strip().splitlines() if line.strip()]
    text = f"{type(error).__name__}: " + (lines[0] if lines else "")
    if len(lines) > 1:
        text += "\n" + "\n".join("      " + line for line in lines[1:][-context_lines:])
    cause = error.__cause__
    while cause is not None and cause.__cause__ is not None:  # the innermost is the real one
        cause = cause.__cause__
    if cause is not None:
        inner = [line.rstrip() for line in str(cause).strip().splitlines() if line.strip()]
        text += f"\n      caused by {type(cause).__name__}: " + "\n      ".join(inner[-context_lines - 1:])
    return text


# (arch, kernel key) of every kernel compiled in this process by a check with
# ``compiled_before=COMPILED_IN_PROCESS``: the ``run`` compile scope, each kernel once per
# arch for the whole run (an arch's compile checks run in one process).
COMPILED_IN_PROCESS: set = set()


def check_launches(launches: list[Launch], arch: int, per_kernel: bool = False,
                   compiled_before: set | None = None) -> CompileResult:
    """Compile every distinct launch for ``arch`` (``per_kernel``: each kernel's first launch
    per pointer element type; with ``compiled_before``, a set kept across calls, only those
    not compiled by an earlier call) and check it against the arch's limits; every launch's
    grid too."""
    limit = SHARED_MEMORY_LIMIT[arch]
    result = CompileResult(arch, launches)
    seen: set = set() if compiled_before is None else {k for a, k in compiled_before if a == arch}
    for launch in launches:
        for axis, (size, cap) in enumerate(zip(launch.grid, MAX_GRID)):
            if size > cap:
                result.problems.append(Problem(launch, f"grid axis {axis} is {size}, over CUDA's limit of {cap}"))
        key = launch.kernel_key() if per_kernel else launch.key()
        if key in seen:
            continue
        seen.add(key)
        if compiled_before is not None:
            compiled_before.add((arch, key))
        compiled = compile_launch(launch, arch)
        if isinstance(compiled, Exception):
            result.problems.append(Problem(launch, f"does not compile: {compile_error_text(compiled)}"))
            continue
        result.compiled += 1
        shared = compiled.metadata.shared
        result.shared[launch.name] = max(shared, result.shared.get(launch.name, 0))
        if shared > limit:
            result.problems.append(
                Problem(launch, f"needs {shared} bytes of shared memory, over {arch_name(arch)}'s limit of {limit}")
            )
        threads = compiled.metadata.num_warps * 32
        if threads > MAX_THREADS_PER_BLOCK:
            result.problems.append(Problem(launch, f"{threads} threads per block, over {MAX_THREADS_PER_BLOCK}"))
    return result


class CompileCheckFailed(AssertionError):
    pass


def assert_compiles(launches: list[Launch], arch: int, per_kernel: bool = False,
                    compiled_before: set | None = None) -> CompileResult:
    """``check_launches`` that fails with every problem listed; returns the result."""
    if not launches:
        raise CompileCheckFailed("no kernel launch was captured: nothing to compile")
    result = check_launches(launches, arch, per_kernel, compiled_before)
    if result.problems:
        lines = "\n".join(f"  {p}" for p in result.problems)
        raise CompileCheckFailed(f"{len(result.problems)} problem(s) for {arch_name(arch)}:\n{lines}")
    return result
