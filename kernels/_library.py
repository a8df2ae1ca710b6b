"""Every public op as a ``torch.library`` custom op, from one declaration per op.

A family writes its launches as two plain functions and registers them once::

    def _forward(q, k, v, beta: Optional[Tensor], ..., scale: float, flag: bool,
                 *, keep, offsets, gate):             # keyword-only: see below
        ...                                           # allocate, launch
        return (o, final_state), (checkpoints,)       # outputs, what the backward reads

    def _backward(grads, saved, q, k, v, ..., *, needs_grad, offsets, gate):
        ...
        return dict(q=dq, k=dk, ...)                  # one gradient per tensor argument

    FUSED = library.register("fused_recurrent_delta_rule", _forward, _backward, gate=GATE_NONE)

and its public function validates, then returns ``FUSED(q, k, v, ..., offsets=offsets)``.

What ``register`` builds from that:

* ``torch.ops.fla.<name>``: the forward as a custom op returning the outputs *and* the
  saved intermediates, and ``torch.ops.fla.<name>_backward``, the backward as a second
  custom op that receives them (``register_autograd`` joins the two). A compiled graph
  holds both as opaque nodes and passes the intermediates from one to the other:
  nothing is recomputed, and inductor never traces into the host code or the kernels.
* Fake (meta) implementations: the same two functions run on fake tensors with every
  ``kernel[grid](...)`` suppressed. The wrappers allocate their outputs from shapes
  alone, so the fake outputs have exactly the real ones' shapes, dtypes and strides,
  symbolic under ``dynamic=True``, intermediates included.
* An eager path: outside ``torch.compile`` the call goes through one
  ``torch.autograd.Function`` over the same two functions (or straight to the forward
  when no gradient is needed), not through the dispatcher, whose per-call argument
  handling costs tens of microseconds of host time with autograd (kernels/README.md).

The forward's annotated positional parameters are the op's arguments (``Tensor``,
``Optional[Tensor]``, ``float``, ``int``, ``bool``, ``Optional[int]``, ``Optional[float]``)
and give its schema. Keyword-only parameters are filled in, never part of the schema:

* ``keep``: whether a backward can follow (grad mode on and a tensor argument requires
  grad); save intermediates only then.
* ``offsets``: with a ``cu_seqlens`` argument, the validated host copy of the offsets,
  else None. Under the fake implementation it is a fake tensor of the same length and
  ``kernels._utils.shapes_only()`` is true: shapes may use its ``numel()``, never its
  values (``kernels._utils.chunk_map`` hands back an empty table; launches do nothing).
* ``needs_grad`` (backward): tensor argument name -> whether its gradient is wanted.
* ``outputs`` (backward): the forward's outputs, for a backward that reads them (the
  attention output); they are kept only for such a backward.
* any other keyword-only parameter: the constant given to ``register`` (one launcher
  behind several public ops, e.g. a gate kind).

Rules the two functions follow: no output shape depends on tensor values (size
per-chunk buffers with ``kernels._sequence.state_slots``); return new tensors, never an
argument or a view of one (an output that aliases an argument or another output is
copied, which costs a copy); no output is 0-dimensional (a 0-d tensor stands in for
``None`` across the op boundary). Values of ``cu_seqlens`` are checked inside the real
implementation under ``torch.compile`` (the wrappers check them before the call in
eager mode), with the same errors.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import typing

import torch
from triton.runtime.jit import KernelInterface

from . import _utils, _validate

NAMESPACE = "fla"
# Set by the test suite's opcheck (its ``fla_through_custom_ops`` ini option): eager calls
# then go through the custom ops, as compiled graphs' do, so that it sees each op's calls.
THROUGH_CUSTOM_OPS = False
# Keyword-only parameters the mechanism fills in.
PROVIDED = ("keep", "offsets", "needs_grad", "outputs")

_SCHEMA_TYPES = {
    torch.Tensor: "Tensor",
    typing.Optional[torch.Tensor]: "Tensor?",
    float: "float",
    int: "int",
    bool: "bool",
    typing.Optional[float]: "float?",
    typing.Optional[int]: "int?",
}

# ----------------------------------------------------------------------------- launches off

_suppress = threading.local()
_patch_lock = threading.Lock()
_patch_users = 0
_original_getitem = KernelInterface.__getitem__


def _getitem_unless_suppressed(self, grid):
    if getattr(_suppress, "depth", 0):
        return _no_launch
    return _original_getitem(self, grid)


def _no_launch(*args, **kwargs):
    return None


@contextlib.contextmanager
def shapes_only():
    """The host code runs for shapes alone in this thread: every ``kernel[grid](...)``
    (plain, autotuned or heuristic) does nothing and ``_utils.shapes_only()`` is true (value
    reads give placeholders); other threads launch as usual."""
    global _patch_users
    with _patch_lock:
        if _patch_users == 0:
            KernelInterface.__getitem__ = _getitem_unless_suppressed
        _patch_users += 1
    _suppress.depth = getattr(_suppress, "depth", 0) + 1
    try:
        with _utils.computing_shapes():
            yield
    finally:
        _suppress.depth -= 1
        with _patch_lock:
            _patch_users -= 1
            if _patch_users == 0:
                KernelInterface.__getitem__ = _original_getitem


# ----------------------------------------------------------------------------- None across the boundary


def _placeholder(device) -> torch.Tensor:
    return torch.zeros((), device=device)


def _is_placeholder(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 0


def _to_list(tensors, device, avoid=()) -> list[torch.Tensor]:
    """Tensors (None as a 0-d placeholder), each copied if it shares storage with one of
    ``avoid`` (the op's arguments) or with an earlier one: a custom op's outputs alias nothing."""
    seen = {t.untyped_storage()._cdata for t in avoid if isinstance(t, torch.Tensor)}
    out = []
    for t in tensors:
        if t is None:
            out.append(_placeholder(device))
            continue
        if t.dim() == 0:
            raise ValueError("a custom op output is 0-dimensional; 0-d tensors stand for None (kernels/_library.py)")
        key = t.untyped_storage()._cdata
        if key in seen:
            t = t.clone()
            key = t.untyped_storage()._cdata
        seen.add(key)
        out.append(t)
    return out


def _from_list(tensors) -> tuple:
    return tuple(None if _is_placeholder(t) else t for t in tensors)


# ----------------------------------------------------------------------------- the op


def _keyword_only(fn) -> set:
    return {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


def _forward_caller(forward, wants: set, fixed: dict):
    """``call(args, keep, offsets)``: ``forward`` with the keywords it takes, built once
    (the eager path runs it on every call)."""
    fn = functools.partial(forward, **fixed) if fixed else forward
    if "keep" in wants and "offsets" in wants:
        return lambda args, keep, offsets: fn(*args, keep=keep, offsets=offsets)
    if "keep" in wants:
        return lambda args, keep, offsets: fn(*args, keep=keep)
    if "offsets" in wants:
        return lambda args, keep, offsets: fn(*args, offsets=offsets)
    return lambda args, keep, offsets: fn(*args)


class LaunchOp:
    """A public op's launches: call it like the forward's positional parameters (plus
    ``offsets=`` from validation); returns the forward's outputs (None where absent)."""

    def __init__(self, name: str, forward, backward, outputs: int, fixed: dict, check_values=None):
        self.name = name
        self.check_values = check_values
        self.n_outputs = outputs
        self.forward = forward
        self.backward = backward
        self.fixed = fixed
        params = list(inspect.signature(forward).parameters.values())
        hints = typing.get_type_hints(forward)
        self.arg_names = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
        kw_only = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
        unknown = kw_only - set(PROVIDED) - set(fixed)
        if unknown or set(fixed) - kw_only:
            raise TypeError(f"{name}: keyword-only parameters {sorted(kw_only)} must be {PROVIDED} or "
                            f"the constants given to register ({sorted(fixed)})")
        self._wants = {fn: _keyword_only(fn) for fn in (forward, backward) if fn is not None}
        self._forward_call = _forward_caller(forward, self._wants[forward], fixed)
        self._eager = _eager_function(self) if backward is not None else None
        self.backward_reads_outputs = backward is not None and "outputs" in self._wants[backward]
        types = []
        for n in self.arg_names:
            hint = hints.get(n)
            if hint not in _SCHEMA_TYPES:
                raise TypeError(f"{name}: parameter `{n}` needs an annotation among Tensor, "
                                f"Optional[Tensor], float, int, bool; got {hint!r}")
            types.append(_SCHEMA_TYPES[hint])
        self.tensor_names = tuple(n for n, t in zip(self.arg_names, types) if t.startswith("Tensor"))
        self._tensor_name_set = frozenset(self.tensor_names)
        self._backward_wants = self._wants.get(backward, frozenset())
        self._tensor_index = tuple(self.arg_names.index(n) for n in self.tensor_names)
        self._scalar_index = tuple(i for i, t in enumerate(types) if not t.startswith("Tensor"))
        self._n_args = len(self.arg_names)
        self._schema = ", ".join(f"{t} {n}" for t, n in zip(types, self.arg_names))
        self.forward_op, self.backward_op = self._define(name, ())
        # Packed sequences: the real implementation reads the offsets on the host (their
        # check, chunk tables), which a CUDA graph would freeze at capture, so graphs
        # holding these twins are not captured (inductor skips or splits them).
        self.varlen_ops = None
        if "cu_seqlens" in self.arg_names:
            self.varlen_ops = self._define(f"{name}_varlen", (torch.Tag.cudagraph_unsafe,))

    def _define(self, name: str, tags):
        """The forward and backward custom ops (the backward None without a backward)."""
        forward = torch.library.custom_op(
            f"{NAMESPACE}::{name}", self._forward_impl, mutates_args=(), tags=tags,
            schema=f"({self._schema}, bool keep) -> Tensor[]",
        )
        forward.register_fake(self._forward_fake)
        if self.backward is None:
            return forward, None
        backward = torch.library.custom_op(
            f"{NAMESPACE}::{name}_backward", self._backward_impl, mutates_args=(), tags=tags,
            schema=f"(Tensor?[] grads, Tensor?[] saved, Tensor?[] outputs, {self._schema}, bool[] needs_grad) -> Tensor[]",
        )
        backward.register_fake(self._backward_fake)
        forward.register_autograd(self._autograd_backward, setup_context=self._setup_context)
        return forward, backward

    def custom_ops(self, args) -> tuple:
        """(forward op, backward op) that a call with ``args`` goes through under torch.compile."""
        if self.varlen_ops is not None and args[self.arg_names.index("cu_seqlens")] is not None:
            return self.varlen_ops
        return self.forward_op, self.backward_op

    # -- calling it

    def __call__(self, *args, offsets=None):
        # The eager path is the hot one (a few microseconds of host time count): no
        # dispatcher, no argument dicts; whether a gradient is wanted, the
        # autograd.Function's needs_input_grad says.
        if THROUGH_CUSTOM_OPS or torch.compiler.is_compiling():
            return self._compiled_call(args)
        if self.backward is not None and torch.is_grad_enabled():
            return self._eager.apply(offsets, *args)
        return self._forward_call(args, False, offsets)[0]

    def _compiled_call(self, args):
        if len(args) != self._n_args:
            raise TypeError(f"{self.name}: expected {self._n_args} arguments {self.arg_names}, got {len(args)}")
        keep = self.backward is not None and torch.is_grad_enabled() and any(
            args[i] is not None and args[i].requires_grad for i in self._tensor_index)
        flat = self.custom_ops(args)[0](*args, keep)
        return _from_list(flat[: self.n_outputs])

    # -- the pieces both paths share

    def _run_forward(self, args, keep, offsets):
        outputs, saved = self._forward_call(args, keep, offsets)
        return tuple(outputs), tuple(saved)

    def _run_backward(self, grads, saved, outputs, args, needs_grad, offsets) -> list:
        # the eager backward runs this on every call: only the keywords the backward takes
        # are built, from sets worked out at registration
        kwargs = dict(self.fixed) if self.fixed else {}
        wants = self._backward_wants
        if "offsets" in wants:
            kwargs["offsets"] = offsets
        if "outputs" in wants:
            kwargs["outputs"] = tuple(outputs)
        if "needs_grad" in wants:
            kwargs["needs_grad"] = dict(zip(self.tensor_names, needs_grad))
        result = self.backward(tuple(grads), tuple(saved), *args, **kwargs)
        if not result.keys() <= self._tensor_name_set:
            unknown = set(result) - self._tensor_name_set
            raise KeyError(f"{self.name}: the backward returned gradients of {sorted(unknown)}, not tensor arguments")
        return [result.get(n) if wanted else None for n, wanted in zip(self.tensor_names, needs_grad)]

    def _host_offsets(self, args):
        """The validated host offsets (the check the wrapper skipped under torch.compile)."""
        kwargs = dict(zip(self.arg_names, args))
        cu_seqlens = kwargs.get("cu_seqlens")
        if cu_seqlens is None:
            return None
        anchor = args[self._tensor_index[0]]
        return _validate.check_cu_seqlens(self.name, cu_seqlens, kwargs.get("cu_seqlens_cpu"),
                                          batch=anchor.shape[0], T=anchor.shape[1], device=anchor.device)

    def _fake_offsets(self, args):
        kwargs = dict(zip(self.arg_names, args))
        if kwargs.get("cu_seqlens") is None:
            return None
        return kwargs.get("cu_seqlens_cpu") if kwargs.get("cu_seqlens_cpu") is not None else kwargs["cu_seqlens"]

    def _device(self, args):
        return args[self._tensor_index[0]].device

    # -- custom-op implementations

    def _forward_impl(self, *args):
        *args, keep = args
        offsets = self._host_offsets(args)
        if self.check_values is not None:
            self.check_values(*args, offsets=offsets)
        outputs, saved = self._run_forward(args, keep, offsets)
        return _to_list(outputs + saved, self._device(args), args)

    def _forward_fake(self, *args):
        *args, keep = args
        with shapes_only():
            outputs, saved = self._run_forward(args, keep, self._fake_offsets(args))
        return _to_list(outputs + saved, self._device(args), args)

    def _backward_impl(self, grads, saved, outputs, *args):
        *args, needs_grad = args
        result = self._run_backward(grads, saved, outputs, args, needs_grad, self._host_offsets(args))
        return _to_list(result, self._device(args), [*grads, *saved, *outputs, *args])

    def _backward_fake(self, grads, saved, outputs, *args):
        *args, needs_grad = args
        with shapes_only():
            result = self._run_backward(grads, saved, outputs, args, needs_grad, self._fake_offsets(args))
        return _to_list(result, self._device(args), [*grads, *saved, *outputs, *args])

    def _setup_context(self, ctx, inputs, output):
        *args, keep = inputs
        outputs = _from_list(output[: self.n_outputs])
        _save(ctx, self, args, _from_list(output[self.n_outputs:]), outputs)
        ctx.outputs_present = [t is not None for t in outputs]

    def _autograd_backward(self, ctx, grads):
        args, saved, outputs = _restore(ctx, self)
        grads = [g if present else None for g, present in zip(grads, ctx.outputs_present)]
        needs_grad = [bool(ctx.needs_input_grad[i]) for i in self._tensor_index]
        flat = self.custom_ops(args)[1](grads, list(saved), list(outputs), *args, needs_grad)
        return (*self._per_argument(_from_list(flat)), None)

    def _per_argument(self, tensor_grads) -> list:
        result = [None] * len(self.arg_names)
        for i, g in zip(self._tensor_index, tensor_grads):
            result[i] = g
        return result


def _save(ctx, op: LaunchOp, args, saved, outputs) -> None:
    """Keep the tensor arguments, the forward's saved tensors and (where the backward
    reads them) its outputs for the backward."""
    tensors = [args[i] for i in op._tensor_index]
    ctx.save_for_backward(*tensors, *saved, *outputs) if op.backward_reads_outputs else \
        ctx.save_for_backward(*tensors, *saved)
    ctx.n_saved = len(saved)
    ctx.scalars = [args[i] for i in op._scalar_index]
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None


def _restore(ctx, op: LaunchOp):
    """(the op's arguments, the forward's saved tensors, its outputs or ()) from ``_save``."""
    stored = ctx.saved_tensors
    n_tensors = len(op._tensor_index)
    args = [None] * op._n_args
    for i, t in zip(op._tensor_index, stored[:n_tensors]):
        args[i] = t
    for i, a in zip(op._scalar_index, ctx.scalars):
        args[i] = a
    rest = stored[n_tensors:]
    return args, rest[: ctx.n_saved], rest[ctx.n_saved:]


def _eager_function(op: LaunchOp):
    """The eager path of ``op``: its forward and backward under one autograd node."""

    class EagerFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, offsets, *args):
            keep = any(ctx.needs_input_grad)
            outputs, saved = op._forward_call(args, keep, offsets)
            if keep:
                _save(ctx, op, args, saved, outputs)
                ctx.offsets = offsets
            return outputs

        @staticmethod
        def backward(ctx, *grads):
            args, saved, outputs = _restore(ctx, op)
            needs_grad = [bool(ctx.needs_input_grad[1 + i]) for i in op._tensor_index]
            return (None, *op._per_argument(op._run_backward(grads, saved, outputs, args, needs_grad, ctx.offsets)))

    EagerFunction.__name__ = EagerFunction.__qualname__ = "".join(w.title() for w in op.name.split("_"))
    return EagerFunction


# ----------------------------------------------------------------------------- registry

OPS: dict[str, LaunchOp] = {}


def register(name: str, forward, backward=None, *, outputs: int = 2, check_values=None, **fixed) -> LaunchOp:
    """Register public op ``name`` as ``torch.ops.fla.<name>`` (and ``<name>_backward``).

    ``outputs``: the number of the forward's outputs (before its saved tensors).
    ``check_values(*args, offsets=...)``: checks of tensor values beyond ``cu_seqlens``
    that the wrapper makes in eager mode but cannot trace; run by the real implementation
    under ``torch.compile``. ``fixed``: the constant keyword-only parameters."""
    op = LaunchOp(name, forward, backward, outputs, fixed, check_values)
    OPS[name] = op
    return op
