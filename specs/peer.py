"""The peer library, fla-core (flash-linear-attention), under this repository's specs.

``pytest --fla-impl=fla`` (this repo's ``conftest.py``) swaps every spec's kernel for the
peer's op of the same name, through a thin adapter where the two signatures differ; the
cases, references, error inputs and checks stay this repo's. The run is a report on the
peer against this repo's contract (``docs/ops.md``), never a gate of this repo's CI.

The release is the installed one (``importlib.metadata.version("fla-core")``, else
``fla.__version__``): ``PEER`` names it, ``ADAPTERS`` are its adapters. Every release on
PyPI since 0.3.2 is mapped (``RELEASES``; what differs between them, op by op:
``docs/peer-releases.md``). An adapter maps arguments (names, defaults, layouts); it never
touches a result beyond a layout. What a release lacks is reported absent (a skip saying
"absent in fla-core X"), never a failure: an op it does not ship, a keyword its function
does not take when the call needs it, an input class its docs do not offer.

The adapters were written from the peer's signatures and docstrings alone
(``inspect.signature``, ``inspect.getdoc``):

* every argument is passed by name (the peer's ``fused_recurrent_gated_delta_rule`` has
  ``gk`` fifth, where ``beta`` would go positionally);
* ``chunk_linear_attn`` / ``fused_recurrent_linear_attn``: ``normalize=False`` (the
  chunked one normalises by default; the contract does not);
* ``fused_recurrent_gla`` names its per-channel gate ``gk``;
* ``fused_recurrent_rwkv7`` returns a final state by default, and its ``scale`` defaults
  to ``1 / sqrt(K)`` (every release's docstring says so; ``chunk_rwkv7``'s and the
  contract's default is 1.0): both are passed as the contract's defaults (False, 1.0) when
  the call does not say. ``chunk_rwkv7`` returned a final state by default up to 0.4.1;
* ``rms_norm`` (default ``eps=1e-5``) and ``rms_norm_gated`` take ``weight`` / ``bias``
  positionally with no default: both are passed, ``eps`` at the contract's 1e-6;
* ``parallel_attn`` is causal only (no ``causal`` argument): a non-causal call raises;
  before 0.5.0 it has no ``window_size`` (absent when a call gives one);
* rotary: the peer's ``rotary_embedding(x, cos, sin, ...)`` gets the angle tables the
  contract's ``apply_rotary(x, dim, base, ...)`` implies;
* ``causal_conv1d`` keeps the last ``W`` inputs as its state (``[N, D, W]``, the oldest
  never read; every release's docstring), the contract the last ``W - 1``: a zero column
  goes in front of the initial state, and the final state's first column is dropped;
* before 0.5.0, ``chunk_linear_attn`` takes no ``cu_seqlens``, and ``chunk_gated_delta_rule``
  / ``chunk_kda`` document ``v`` with as many heads as ``q`` (no grouped value heads):
  those calls are absent there; ``chunk_kda`` / ``fused_recurrent_kda`` first ship in 0.4.0;
* ``chunk_hgrn`` takes no ``cu_seqlens`` in any release: its packed calls are absent.

Ops of this repo without a counterpart in fla-core (the GatedDeltaNet layer as a function
of its parameters) are left out. Compile checks are left out too: they call the op with CPU
tensors under launch capture, which only this repo's wrappers accept.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import re
from typing import Callable

# every fla-core release on PyPI, oldest first
RELEASES = ("0.3.2", "0.4.0", "0.4.1", "0.4.2", "0.5.0", "0.5.1", "0.5.2", "0.6.0")
NEWEST = RELEASES[-1]


def release_key(release: str) -> tuple[int, ...]:
    """``"0.4.2"`` -> ``(0, 4, 2)`` (a suffix such as ``.post1`` or ``rc1`` is ignored)."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release)
    if match is None:
        raise ValueError(f"not a release number: {release!r}")
    return tuple(int(part or 0) for part in match.groups())


def installed_release() -> str | None:
    """The installed fla-core's release: its package metadata, else ``fla.__version__``;
    None where no fla is importable."""
    try:
        return importlib.metadata.version("fla-core")
    except importlib.metadata.PackageNotFoundError:
        pass
    if importlib.util.find_spec("fla") is None:
        return None
    return getattr(importlib.import_module("fla"), "__version__", None)


@dataclasses.dataclass(frozen=True)
class Lack:
    """An input class a release's docs do not offer: ``applies(kwargs)`` says whether a call
    is one of them."""

    what: str
    applies: Callable


@dataclasses.dataclass(frozen=True)
class Adapter:
    """Calls the peer's ``module.function`` with the contract's keyword arguments:
    ``rename`` maps ours to theirs, ``defaults`` fills arguments the call leaves out,
    ``prepare(kwargs) -> kwargs`` reshapes the rest (``consumes``: the keywords it takes
    away), ``finish(result) -> result`` the peer's result.

    What ``release`` lacks: ``absent`` (why the op is not there: every call skips),
    ``absent_keywords`` (keywords its function does not take: dropped where None, a skip
    where given) and ``lacks`` (input classes its docs do not offer: a skip)."""

    module: str
    function: str
    rename: tuple = ()
    defaults: tuple = ()
    prepare: Callable | None = None
    finish: Callable | None = None
    consumes: tuple = ()
    release: str = NEWEST
    absent: str | None = None
    absent_keywords: tuple = ()
    lacks: tuple = ()

    @property
    def peer(self) -> str:
        return f"fla-core {self.release}"

    @property
    def target(self) -> Callable:
        if self.absent is not None:
            raise LookupError(self.absence())
        return getattr(importlib.import_module(self.module), self.function)

    def absence(self, what: str | None = None) -> str:
        """The skip's reason: ``what`` (the op itself by default) absent in this release."""
        if what is None:
            return f"{self.function} absent in {self.peer}: {self.absent}"
        return f"{what} absent in {self.peer}'s {self.function}"

    def __call__(self, **kwargs):
        import pytest

        if self.absent is not None:
            pytest.skip(self.absence())
        kwargs = {**dict(self.defaults), **kwargs}
        for name in self.absent_keywords:
            if kwargs.get(name) is not None:
                pytest.skip(self.absence(f"`{name}`"))
            kwargs.pop(name, None)
        for lack in self.lacks:
            if lack.applies(kwargs):
                pytest.skip(self.absence(lack.what))
        if self.prepare is not None:
            kwargs = self.prepare(kwargs)
        names = dict(self.rename)
        target = self.target
        for name in HINTS:  # a hint the release's function does not take changes no result: left out
            if name in kwargs and not _takes(target, names.get(name, name)):
                kwargs.pop(name)
        result = target(**{names.get(k, k): v for k, v in kwargs.items()})
        return result if self.finish is None else self.finish(result)

    def __repr__(self) -> str:
        return f"{self.module}.{self.function}"


# keywords of the contract that only spare work (a host copy of ``cu_seqlens``, so no sync
# reads it): where the peer's function takes no such keyword, the call goes without it
HINTS = ("cu_seqlens_cpu",)


def _takes(function: Callable, name: str) -> bool:
    params = inspect.signature(function).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@dataclasses.dataclass(frozen=True)
class Before:
    """Adapter fields that hold in the releases older than ``release``."""

    release: str
    fields: dict


def before(release: str, **fields) -> Before:
    return Before(release, fields)


@dataclasses.dataclass(frozen=True)
class PerRelease:
    """One op's adapter, release by release: ``base`` (the newest release's), changed by
    each ``Before`` that holds (in order; a later one's fields win)."""

    base: Adapter
    changes: tuple = ()

    def at(self, release: str) -> Adapter:
        fields = {"release": release}
        for change in self.changes:
            if release_key(release) < release_key(change.release):
                fields.update(change.fields)
        return dataclasses.replace(self.base, **fields)


def _attention(kwargs: dict) -> dict:
    if kwargs.pop("causal", True) is not True:
        raise NotImplementedError(f"{PEER}'s parallel_attn is causal only: it takes no `causal` argument")
    return kwargs


def _rotary_tables(kwargs: dict) -> dict:
    """``apply_rotary(x, dim, base, interleaved, seqlen_offset, cu_seqlens)`` as the peer's
    ``rotary_embedding(x, cos, sin, interleaved, seqlen_offsets, cu_seqlens)``: pair ``i``
    at position ``p`` turns by ``p * base^(-2i/dim)``; the tables cover every position used,
    in ``x``'s dtype (the peer refuses tables of another dtype: "Input and cos/sin must have
    the same dtype", its first GPU report)."""
    import torch

    x = kwargs.pop("x")
    dim, base = kwargs.pop("dim"), kwargs.pop("base", 10000.0)
    offset = kwargs.pop("seqlen_offset", 0)
    largest = int(offset.max()) if isinstance(offset, torch.Tensor) and offset.numel() else int(offset)
    positions = torch.arange(x.shape[1] + largest + 1, dtype=torch.float64, device=x.device)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim)
    angles = torch.outer(positions, inv_freq)
    kwargs.pop("cu_seqlens_cpu", None)
    return {"x": x, "cos": angles.cos().to(x.dtype), "sin": angles.sin().to(x.dtype), "seqlen_offsets": offset, **kwargs}


def _conv_window_in(kwargs: dict) -> dict:
    """The contract's ``initial_state [N, D, W-1]`` (the last ``W - 1`` inputs) as the peer's
    ``[N, D, W]`` (the last ``W``, the oldest of which its window never reads: zero)."""
    import torch.nn.functional as F

    state = kwargs.get("initial_state")
    return kwargs if state is None else {**kwargs, "initial_state": F.pad(state, (1, 0))}


def _conv_window_out(result):
    """The peer's ``final_state [N, D, W]`` as the contract's last ``W - 1`` inputs."""
    y, final_state = result
    return y, (None if final_state is None else final_state[..., 1:])


def _grouped_values(kwargs: dict) -> bool:
    q, v = kwargs.get("q"), kwargs.get("v")
    if min(getattr(q, "ndim", 0), getattr(v, "ndim", 0)) < 3:
        return False
    return v.shape[2] != q.shape[2]


# before 0.5.0 the chunked gated delta rules document v [B, T, H, V]: as many heads as q
GROUPED_VALUES = Lack("grouped value heads (`v` with more heads than `q`)", _grouped_values)


def _same(module: str, function: str, *changes: Before, **fields) -> PerRelease:
    return PerRelease(Adapter(module, function, **fields), changes)


NO_NORMALIZE = (("normalize", False),)
NO_FINAL_STATE = (("output_final_state", False),)
KDA_FIRST = before("0.4.0", absent="fla.ops.kda first ships in fla-core 0.4.0")
# our op name -> the peer's op, release by release
PER_RELEASE = {
    "chunk_linear_attn": _same("fla.ops.linear_attn", "chunk_linear_attn",
                               before("0.5.0", absent_keywords=("cu_seqlens",)), defaults=NO_NORMALIZE),
    "fused_recurrent_linear_attn": _same("fla.ops.linear_attn", "fused_recurrent_linear_attn", defaults=NO_NORMALIZE),
    "chunk_simple_gla": _same("fla.ops.simple_gla", "chunk_simple_gla"),
    "fused_recurrent_simple_gla": _same("fla.ops.simple_gla", "fused_recurrent_simple_gla"),
    "chunk_retention": _same("fla.ops.retention", "chunk_retention"),
    "fused_recurrent_retention": _same("fla.ops.retention", "fused_recurrent_retention"),
    "chunk_gla": _same("fla.ops.gla", "chunk_gla"),
    "fused_recurrent_gla": _same("fla.ops.gla", "fused_recurrent_gla", rename=(("g", "gk"),)),
    "chunk_delta_rule": _same("fla.ops.delta_rule", "chunk_delta_rule"),
    "fused_recurrent_delta_rule": _same("fla.ops.delta_rule", "fused_recurrent_delta_rule"),
    "chunk_gated_delta_rule": _same("fla.ops.gated_delta_rule", "chunk_gated_delta_rule",
                                    before("0.5.0", lacks=(GROUPED_VALUES,))),
    "fused_recurrent_gated_delta_rule": _same("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),
    "chunk_kda": _same("fla.ops.kda", "chunk_kda", before("0.5.0", lacks=(GROUPED_VALUES,)), KDA_FIRST),
    "fused_recurrent_kda": _same("fla.ops.kda", "fused_recurrent_kda", KDA_FIRST),
    "chunk_dplr_delta_rule": _same("fla.ops.generalized_delta_rule", "chunk_dplr_delta_rule"),
    "fused_recurrent_dplr_delta_rule": _same("fla.ops.generalized_delta_rule", "fused_recurrent_dplr_delta_rule"),
    "chunk_rwkv7": _same("fla.ops.rwkv7", "chunk_rwkv7", before("0.4.2", defaults=NO_FINAL_STATE)),
    "fused_recurrent_rwkv7": _same("fla.ops.rwkv7", "fused_recurrent_rwkv7",
                                   defaults=NO_FINAL_STATE + (("scale", 1.0),)),
    "chunk_rwkv6": _same("fla.ops.rwkv6", "chunk_rwkv6"),
    "fused_recurrent_rwkv6": _same("fla.ops.rwkv6", "fused_recurrent_rwkv6"),
    "chunk_hgrn": _same("fla.ops.hgrn", "chunk_hgrn", absent_keywords=("cu_seqlens",)),  # in no release
    "fused_recurrent_hgrn": _same("fla.ops.hgrn", "fused_recurrent_hgrn"),
    "parallel_attn": _same("fla.ops.attn", "parallel_attn", before("0.5.0", absent_keywords=("window_size",)),
                           prepare=_attention, consumes=("causal",)),
    "l2norm": _same("fla.modules.l2norm", "l2norm"),
    "rms_norm": _same("fla.modules.layernorm", "rms_norm",
                      defaults=(("weight", None), ("bias", None), ("eps", 1e-6))),
    "rms_norm_gated": _same("fla.modules.fused_norm_gate", "rms_norm_gated",
                            defaults=(("weight", None), ("bias", None), ("eps", 1e-6))),
    "causal_conv1d": _same("fla.modules.convolution", "causal_conv1d", prepare=_conv_window_in, finish=_conv_window_out),
    "apply_rotary": _same("fla.modules.rotary", "rotary_embedding", prepare=_rotary_tables),
    "rotary_embedding": _same("fla.modules.rotary", "rotary_embedding"),
}


def adapters(release: str) -> dict[str, Adapter]:
    """Our op name -> the adapter for fla-core ``release`` (a release newer than ``NEWEST``
    gets the newest's)."""
    return {name: per.at(release) for name, per in PER_RELEASE.items()}


RELEASE = installed_release() or NEWEST  # the adapters' release where none is installed
PEER = f"fla-core {RELEASE}"
ADAPTERS = adapters(RELEASE)


def peer_spec(spec, adapters_: dict | None = None):
    """``spec`` with the peer's op in place of this repo's (None: no counterpart)."""
    adapter = (ADAPTERS if adapters_ is None else adapters_).get(spec.name)
    if adapter is None:
        return None
    # this repo's compile cases, each of the peer's kernels compiled offline for each arch
    # (a kernel that does not compile for one is a defect), with the float32 states every
    # release takes (some of its ops assert "initial_state must be in float32")
    return dataclasses.replace(spec, op=adapter, min_arch=None, compile_state_dtypes=())


def peer_specs(specs=None) -> list:
    """The peer's counterparts of this repo's specs (``specs``: default, all of them); an op
    the installed release lacks stays, its calls skipping as absent."""
    if importlib.util.find_spec("fla") is None:
        import pytest

        raise pytest.UsageError("--fla-impl=fla checks fla-core, which is not importable here: install its wheel "
                                "(benchmarks/gpu_run.sh installs .whl/*.whl into a --target folder on PYTHONPATH)")
    if specs is None:
        from . import all_specs

        specs = all_specs()
    cpu_device_context()
    peers = [p for p in (peer_spec(s) for s in specs) if p is not None]
    import_before_the_checks(p.op for p in peers)
    names = {p.name for p in peers}
    return [p if p.agrees_with in names or p.agrees_with is None else dataclasses.replace(p, agrees_with=None)
            for p in peers]


def import_before_the_checks(adapters) -> None:
    """Import the release's modules now, before any check: fla-core's import asks Triton's
    driver which GPU it is on (and then torch.cuda for the device's name), and a compile
    check captures launches with a driver standing in for the arch's card where none is
    (``pytest_fla.checks.capture``); imported under it, a CPU-only torch fails the import.
    A module that fails to import here fails again in the call, and is classed there."""
    for adapter in adapters:
        if adapter.absent is None:
            try:
                importlib.import_module(adapter.module)
            except Exception:  # noqa: BLE001 - reported by the call that needs it
                pass


def cpu_device_context() -> None:
    """fla-core up to 0.5.0 enters ``torch.<device type>.device(index)`` around each call;
    for CPU tensors that is ``torch.cpu.device``, which torch does not have, and every call
    failed on the CPU before any kernel ran ("module 'torch.cpu' has no attribute 'device'").
    The CPU has one device and nothing to switch: a context that does nothing is what one
    would do, and the call's kernels then run under the interpreter unchanged (0.4.2 and
    0.5.0's fused and module ops; 0.3.2 to 0.4.1's kernels the interpreter cannot run)."""
    import contextlib

    import torch

    if not hasattr(torch.cpu, "device"):
        torch.cpu.device = lambda index=None: contextlib.nullcontext()


def passed_arguments(spec, adapter: Adapter) -> set[str]:
    """The keywords the adapter hands the peer's function for the spec's samples (those it
    drops as absent, or consumes, left out)."""
    passed = set(dict(adapter.defaults))
    for case in spec.cases:
        passed |= set(spec.sample(case, "fp32", "cpu").kwargs)
    if spec.varlen:
        passed.add("cu_seqlens")
    passed -= set(adapter.absent_keywords) | set(adapter.consumes)
    names = dict(adapter.rename)
    return {names.get(k, k) for k in passed}


def unexpected_arguments(spec, adapter: Adapter) -> list[str]:
    """Arguments the spec's samples pass that the peer's function does not take (they
    fail as unexpected keywords); empty where the function takes ``**kwargs`` or the
    adapter rewrites the call (a ``prepare`` that does not say what it ``consumes``)."""
    params = inspect.signature(adapter.target).parameters
    if (adapter.prepare is not None and not adapter.consumes) or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    return sorted(passed_arguments(spec, adapter) - set(params))


def signature_problems(specs=None) -> list[str]:
    """What keeps the installed release's adapters from matching its signatures, one line
    each (empty: none): a target that does not resolve, a keyword the spec's samples pass
    that its function does not take, and a declared absence the release contradicts (the
    op, or a keyword, there after all)."""
    if specs is None:
        from . import all_specs

        specs = all_specs()
    problems = []
    for spec in specs:
        adapter = ADAPTERS.get(spec.name)
        if adapter is None:
            continue
        if adapter.absent is not None:
            try:
                getattr(importlib.import_module(adapter.module), adapter.function)
            except (ImportError, AttributeError):
                continue
            problems.append(f"{spec.name}: declared absent in {PEER}, but {adapter!r} is there")
            continue
        try:
            params = inspect.signature(adapter.target).parameters
        except (ImportError, AttributeError) as error:
            problems.append(f"{spec.name}: {adapter!r} does not resolve in {PEER}: {error}")
            continue
        unexpected = unexpected_arguments(spec, adapter)
        if unexpected:
            problems.append(f"{spec.name}: {PEER}'s {adapter.function} takes no {unexpected}")
        taken = [k for k in adapter.absent_keywords if k in params]
        if taken:
            problems.append(f"{spec.name}: {taken} declared absent in {PEER}, but {adapter.function} takes them")
    return problems
