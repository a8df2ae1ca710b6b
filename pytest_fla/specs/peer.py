"""The peer library, fla-core 0.6.0 (flash-linear-attention), under this repository's specs.

``pytest --fla-impl=fla`` (this repo's ``conftest.py``) swaps every spec's kernel for the
peer's op of the same name, through a thin adapter where the two signatures differ; the
cases, references, error inputs and checks stay this repo's. The run is a report on the
peer against this repo's contract (``docs/ops.md``), never a gate of this repo's CI.

The adapters were written from the peer's signatures alone (``inspect.signature``):

* every argument is passed by name (the peer's ``fused_recurrent_gated_delta_rule`` has
  ``gk`` fifth, where ``beta`` would go positionally);
* ``chunk_linear_attn`` / ``fused_recurrent_linear_attn``: ``normalize=False`` (the
  chunked one normalises by default; the contract does not);
* ``fused_recurrent_gla`` names its per-channel gate ``gk``;
* ``fused_recurrent_rwkv7`` returns a final state by default: ``output_final_state``
  is passed as the contract's default (False) when the call does not say;
* ``rms_norm`` (default ``eps=1e-5``) and ``rms_norm_gated`` take ``weight`` / ``bias``
  positionally with no default: both are passed, ``eps`` at the contract's 1e-6;
* ``parallel_attn`` is causal only (no ``causal`` argument): a non-causal call raises;
* rotary: the peer's ``rotary_embedding(x, cos, sin, ...)`` gets the angle tables the
  contract's ``apply_rotary(x, dim, base, ...)`` implies;
* ``causal_conv1d`` keeps the last ``W`` inputs as its state (``[N, D, W]``, the oldest
  never read), the contract the last ``W - 1``: a zero column goes in front of the
  initial state, and the final state's first column is dropped.

Ops of this repo without a counterpart in fla-core 0.6.0 (the GatedDeltaNet layer as a
function of its parameters) are left out. Compile checks are left out too: they call the
op with CPU tensors under launch capture, which only this repo's wrappers accept.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
from typing import Callable

PEER = "fla-core 0.6.0"


@dataclasses.dataclass(frozen=True)
class Adapter:
    """Calls the peer's ``module.function`` with the contract's keyword arguments:
    ``rename`` maps ours to theirs, ``defaults`` fills arguments the call leaves out,
    ``prepare(kwargs) -> kwargs`` reshapes the rest, ``finish(result) -> result`` the
    peer's result."""

    module: str
    function: str
    rename: tuple = ()
    defaults: tuple = ()
    prepare: Callable | None = None
    finish: Callable | None = None

    @property
    def target(self) -> Callable:
        return getattr(importlib.import_module(self.module), self.function)

    def __call__(self, **kwargs):
        kwargs = {**dict(self.defaults), **kwargs}
        if self.prepare is not None:
            kwargs = self.prepare(kwargs)
        names = dict(self.rename)
        result = self.target(**{names.get(k, k): v for k, v in kwargs.items()})
        return result if self.finish is None else self.finish(result)

    def __repr__(self) -> str:
        return f"{self.module}.{self.function}"


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


def _same(module: str, function: str, **fields) -> Adapter:
    return Adapter(module, function, **fields)


NO_NORMALIZE = (("normalize", False),)
# our op name -> the peer's op
ADAPTERS = {
    "chunk_linear_attn": _same("fla.ops.linear_attn", "chunk_linear_attn", defaults=NO_NORMALIZE),
    "fused_recurrent_linear_attn": _same("fla.ops.linear_attn", "fused_recurrent_linear_attn", defaults=NO_NORMALIZE),
    "chunk_simple_gla": _same("fla.ops.simple_gla", "chunk_simple_gla"),
    "fused_recurrent_simple_gla": _same("fla.ops.simple_gla", "fused_recurrent_simple_gla"),
    "chunk_retention": _same("fla.ops.retention", "chunk_retention"),
    "fused_recurrent_retention": _same("fla.ops.retention", "fused_recurrent_retention"),
    "chunk_gla": _same("fla.ops.gla", "chunk_gla"),
    "fused_recurrent_gla": _same("fla.ops.gla", "fused_recurrent_gla", rename=(("g", "gk"),)),
    "chunk_delta_rule": _same("fla.ops.delta_rule", "chunk_delta_rule"),
    "fused_recurrent_delta_rule": _same("fla.ops.delta_rule", "fused_recurrent_delta_rule"),
    "chunk_gated_delta_rule": _same("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "fused_recurrent_gated_delta_rule": _same("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),
    "chunk_kda": _same("fla.ops.kda", "chunk_kda"),
    "fused_recurrent_kda": _same("fla.ops.kda", "fused_recurrent_kda"),
    "chunk_dplr_delta_rule": _same("fla.ops.generalized_delta_rule", "chunk_dplr_delta_rule"),
    "fused_recurrent_dplr_delta_rule": _same("fla.ops.generalized_delta_rule", "fused_recurrent_dplr_delta_rule"),
    "chunk_rwkv7": _same("fla.ops.rwkv7", "chunk_rwkv7"),
    "fused_recurrent_rwkv7": _same("fla.ops.rwkv7", "fused_recurrent_rwkv7", defaults=(("output_final_state", False),)),
    "chunk_rwkv6": _same("fla.ops.rwkv6", "chunk_rwkv6"),
    "fused_recurrent_rwkv6": _same("fla.ops.rwkv6", "fused_recurrent_rwkv6"),
    "chunk_hgrn": _same("fla.ops.hgrn", "chunk_hgrn"),
    "fused_recurrent_hgrn": _same("fla.ops.hgrn", "fused_recurrent_hgrn"),
    "parallel_attn": _same("fla.ops.attn", "parallel_attn", prepare=_attention),
    "l2norm": _same("fla.modules.l2norm", "l2norm"),
    "rms_norm": _same("fla.modules.layernorm", "rms_norm",
                      defaults=(("weight", None), ("bias", None), ("eps", 1e-6))),
    "rms_norm_gated": _same("fla.modules.fused_norm_gate", "rms_norm_gated",
                            defaults=(("weight", None), ("bias", None), ("eps", 1e-6))),
    "causal_conv1d": _same("fla.modules.convolution", "causal_conv1d", prepare=_conv_window_in, finish=_conv_window_out),
    "apply_rotary": _same("fla.modules.rotary", "rotary_embedding", prepare=_rotary_tables),
    "rotary_embedding": _same("fla.modules.rotary", "rotary_embedding"),
}


def peer_spec(spec):
    """``spec`` with the peer's op in place of this repo's (None: no counterpart)."""
    adapter = ADAPTERS.get(spec.name)
    if adapter is None:
        return None
    return dataclasses.replace(spec, op=adapter, compile_cases=(), min_arch=None)


def peer_specs(specs=None) -> list:
    """The peer's counterparts of this repo's specs (``specs``: default, all of them)."""
    if importlib.util.find_spec("fla") is None:
        import pytest

        raise pytest.UsageError(f"--fla-impl=fla checks {PEER}, which is not importable here: install its wheel "
                                "(benchmarks/gpu_run.sh installs .whl/*.whl into a --target folder on PYTHONPATH)")
    if specs is None:
        from . import all_specs

        specs = all_specs()
    peers = [p for p in (peer_spec(s) for s in specs) if p is not None]
    names = {p.name for p in peers}
    return [p if p.agrees_with in names or p.agrees_with is None else dataclasses.replace(p, agrees_with=None)
            for p in peers]


def unexpected_arguments(spec, adapter: Adapter) -> list[str]:
    """Arguments the spec's samples pass that the peer's function does not take (they
    fail as unexpected keywords); empty where the function takes ``**kwargs`` or the
    adapter rewrites the call."""
    params = inspect.signature(adapter.target).parameters
    if adapter.prepare is not None or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    passed = set(dict(adapter.defaults))
    for case in spec.cases:
        passed |= set(spec.sample(case, "fp32", "cpu").kwargs)
    if spec.varlen:
        passed.add("cu_seqlens")
    names = dict(adapter.rename)
    return sorted({names.get(k, k) for k in passed} - set(params))
