"""Time every op against the peer library (fla-core) on one GPU, in one run.

    python benchmarks/bench.py [--ops chunk_gla,l2norm] [--rounds 5] [--warm 16] [--out DIR/NAME] [--resume]
    python benchmarks/bench.py --merge DIR/NAME.json --into benchmarks/results/bench/bench_h200

Both sides get the same input tensors and do the same work: the same gates (each under
the name its side declares: a keyword the callee does not declare is an error here, never
swallowed by a ``**kwargs``), the same learnable weights with their gradients, the same
options (the peer's ``chunk_linear_attn`` gets ``normalize=False``); modules are built
once, outside the timed calls.

Each op is timed in interleaved rounds, forward and forward+backward: a round times ours
and the peer's back to back (``triton.testing.do_bench``, the median of repeated calls
after warm-up, L2 flushed between calls), the order alternating from round to round. The
report gives each side's median over the rounds, and the ratio (peer / ours: above 1 means
ours is faster) as the median of the per-round ratios with their min-max, since single
runs on the same machine kind moved by up to 1.6x.

Where the peer has several calls for the same work (``peer_variants``: SDPA's flash, cuDNN
and efficient backends and its default dispatch, against ``parallel_attn``), each is a side
of its own in the same interleaved rounds, and the peer's time in a round is the fastest of
them that round: the ratio is against the best the platform offers. Each variant's own
median and ratio are listed under the table. Attention's layout is counted alike on both
sides: inputs and output ``[B, T, H, D]``, which SDPA reads as ``[B, H, T, D]`` through
strides (no copy before or after the call); a copy a backend makes inside is in its time.

Beside the ratio: ours as a fraction of the op's floor, the larger of a memory floor (the
bytes the op must move once: its inputs and outputs, and for the backward its inputs, the
output gradients and the input gradients, over the device copy bandwidth measured at the
start) and, for chunked ops, a tensor-core floor (a FLOP count of the chunked algorithm
over the measured bf16 matmul throughput).

With ``--graphs`` each op is also timed with each side's call captured once in a CUDA
graph and replayed: the same kernels with no host time in it. Where a side's kernels take
less time than its CPU needs to issue them (launches, the autograd engine; the forward+
backward of the small memory-bound ops), the plain time is host time and moves with the
machine's CPU; the graph time is what a model compiled with CUDA graphs gets.

Results go to ``<out>.json`` and ``<out>.md`` after every op (a run cut by a time limit
keeps what it measured; ``--resume`` then times only the ops missing from the JSON); the
table is printed last.

With ``--gpus N`` (a host with several GPUs) the warm-up is shared, then the ops are dealt
to N timing processes in turn, one pinned to each GPU (``CUDA_VISIBLE_DEVICES``), which
time at the same time, each into ``<out>.gpu<i>.*``; their rows are merged into ``<out>``
in the bench's order, each with its GPU, and each GPU's rates and host line are kept. The
host is shared: a line bound by its host time moves with what the others issue.

One file per measurement: ``--merge RUN.json --into <stem>`` puts a run's rows (a whole
run, or a partial re-run of some ops) in place of the same ops' rows of ``<stem>.json.gz``
(created if absent), the rest kept in the bench's order, and writes ``<stem>.json.gz`` and
``<stem>.md``; each row names its run, and each run (date, machine, rounds, host, command)
that still has a row is kept in ``runs``. ``gpu_run.sh bench`` does this after every run.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import importlib
import inspect
import json
import math
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import host_timing  # noqa: E402  (beside this file)

LINEAR = dict(B=4, T=4096, H=16, K=128, V=128)
# the delta rules at GatedDeltaNet's default head dims (head_dim 256, expand_v 2): 6 heads
# of K = 256 and V = 512, as the default layer (hidden 2048) runs them
WIDE_V = dict(B=4, T=4096, H=6, K=256, V=512)
MODULE = dict(B=8, T=4096, H=32, D=128)
# the gated norm at the layer's default value head (512: head_dim 256 x expand_v 2), the same
# number of elements as MODULE
WIDE_MODULE = dict(B=8, T=4096, H=8, D=512)
# and either side of it, whose backward tiles were timed apart (kernels/norm.py,
# BWD_TILE_ELEMENTS_GATED): a layer of head_dim 256 with expand_v 1, and 1024-wide heads
GATED_NORM_WIDTHS = {D: dict(B=8, T=4096, H=4096 // D, D=D) for D in (256, 1024)}
CONV = dict(B=8, T=4096, D=4096, W=4)
CHUNK = 64  # the chunk length the tensor-core floor's FLOP count assumes
# Softmax attention: dense causal against every SDPA backend (every head its own k and v
# on both sides; the ratio against the fastest), packed sequences of mixed lengths against the peer's varlen kernel with
# grouped heads (HKV = 4).
ATTENTION = dict(B=4, T=4096, H=16, HKV=4, D=128, lengths=(512, 3584, 4096, 1024, 2048, 5120))
HGRN = dict(B=4, T=4096, D=2048)


@dataclass
class Bench:
    name: str
    ours: str                      # dotted path in this repo
    peer: str | None               # dotted path in fla, or None where it has no counterpart
    inputs: Callable[[], dict]     # keyword arguments, on the GPU; both sides get the same tensors
    grads: tuple[str, ...]         # inputs that get gradients in forward+backward
    # bytes the op must move (forward, forward+backward), where counting the inputs, outputs
    # and gradients would overstate it (e.g. rotary's backward needs no input)
    floor_bytes: tuple[int, int] | None = None
    call: Callable | None = None       # how to call our side: call(obj, kwargs) -> outputs
    peer_call: Callable | None = None  # the same for the peer
    build: Callable | None = None      # obj = build(resolved): e.g. a module, built once outside the timing
    peer_build: Callable | None = None
    flops: Callable[[], tuple[float, float]] | None = None  # (forward, forward+backward) FLOPs, chunked ops
    # several calls of the peer (e.g. SDPA's backends), label -> call: each is a side of its
    # own ("peer <label>"), and the peer's time is the fastest of them each round
    peer_variants: dict[str, Callable] | None = None
    notes: list = field(default_factory=list)


def resolve(path: str):
    module, _, name = path.rpartition(".")
    obj = importlib.import_module(module)
    for part in name.split("/"):
        obj = getattr(obj, part)
    return obj


DEVICE = "cuda"


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(shape, device=DEVICE, dtype=torch.float32).to(dtype)


def linear_inputs(gate: str | None = None, beta: bool = False, normalize_k: bool = False, gva: int = 1, dims=LINEAR):
    def make():
        B, T, H, K, V = dims["B"], dims["T"], dims["H"], dims["K"], dims["V"]
        HV = H * gva
        k = rand(B, T, H, K)
        if normalize_k:
            k = F.normalize(k.float(), dim=-1).to(torch.bfloat16)
        kw = dict(q=rand(B, T, H, K), k=k, v=rand(B, T, HV, V))
        if gate == "scalar":
            kw["g"] = F.logsigmoid(rand(B, T, HV, dtype=torch.float32)) / 8
        elif gate == "channel":
            kw["g"] = F.logsigmoid(rand(B, T, H, K, dtype=torch.float32)) / 8
        if beta:
            kw["beta"] = torch.sigmoid(rand(B, T, HV, dtype=torch.float32)).to(torch.bfloat16)
        return kw

    return make


def dplr_inputs(names=("q", "gk")):
    """RWKV-7's inputs (docs/ops.md): kk a unit vector, a = -kk, b = kk * sigmoid, the log decay
    w = -e^{-1/2} sigmoid; ``names``: what the op calls q and the gate (r, w for rwkv7)."""

    def make():
        B, T, H, K, V = LINEAR["B"], LINEAR["T"], LINEAR["H"], LINEAR["K"], LINEAR["V"]
        kk = F.normalize(rand(B, T, H, K, dtype=torch.float32), dim=-1)
        gate = -math.exp(-0.5) * torch.sigmoid(rand(B, T, H, K, dtype=torch.float32))
        b = kk * torch.sigmoid(rand(B, T, H, K, dtype=torch.float32))
        q_name, gate_name = names
        return {q_name: rand(B, T, H, K), "k": rand(B, T, H, K), "v": rand(B, T, H, V),
                "a": (-kk).to(torch.bfloat16), "b": b.to(torch.bfloat16), gate_name: gate.to(torch.bfloat16)}

    return make


def module_inputs(kind: str, dims=MODULE):
    def make():
        B, T, H, D = dims["B"], dims["T"], dims["H"], dims["D"]
        if kind == "rotary":
            return dict(q=rand(B, T, H, D), k=rand(B, T, H, D))
        if kind == "norm":  # a learnable weight, as the peer's RMSNorm module carries
            return dict(x=rand(B, T, H, D), weight=torch.ones(D, device=DEVICE, dtype=torch.bfloat16))
        if kind == "gated":
            return dict(x=rand(B, T, H, D), g=rand(B, T, H, D), weight=torch.ones(D, device=DEVICE, dtype=torch.bfloat16))
        if kind == "conv":
            B, T, D, W = CONV["B"], CONV["T"], CONV["D"], CONV["W"]
            return dict(x=rand(B, T, D), weight=rand(D, W), bias=rand(D))
        return dict(x=rand(B, T, H, D))

    return make


def chunk_flops(delta: bool = False, dims=LINEAR):
    """FLOPs of the chunked algorithm at the ``dims`` size, per (token, head): the intra-chunk
    scores and their product with v (2C(K+V)), the inter-chunk read of the state and its
    update (4KV); the delta rule adds the in-chunk system for w and u (2C(2K+V)) and the
    corrected values (2KV). The backward is taken as twice the forward (each product has
    two gradient products)."""
    def count():
        K, V, C = dims["K"], dims["V"], CHUNK
        per = 2 * C * (K + V) + 4 * K * V + (2 * C * (2 * K + V) + 2 * K * V if delta else 0)
        fwd = per * dims["B"] * dims["T"] * dims["H"]
        return fwd, 3 * fwd

    return count


def rotary_floor():
    n = MODULE["B"] * MODULE["T"] * MODULE["H"] * MODULE["D"] * 2
    return 4 * n, 8 * n  # read q, k, write them; backward reads dq, dk and writes their gradients


def with_kwargs(**extra):
    """Call the function with ``extra`` keyword arguments added (e.g. an option whose
    default differs between the sides)."""
    return lambda fn, kwargs: strict_call(fn, {**kwargs, **extra})


def renamed(**names):
    """Call the function with some inputs under the names it declares (old=new)."""
    return lambda fn, kwargs: strict_call(fn, {names.get(k, k): v for k, v in kwargs.items()})


def strict_call(fn, kwargs):
    """fn(**kwargs), refusing a keyword the callee does not declare by name: a ``**kwargs``
    would swallow it silently, and the side would time different work. The check runs once
    per callee and set of names (a signature costs tens of microseconds of host time, which
    a host-bound line would time)."""
    _check_keywords(fn, tuple(kwargs))
    return fn(**kwargs)


@functools.lru_cache(maxsize=None)
def _check_keywords(fn, names: tuple) -> None:
    params = inspect.signature(fn).parameters
    unknown = [k for k in names if k not in params or params[k].kind is inspect.Parameter.VAR_KEYWORD]
    if unknown:
        raise TypeError(f"{getattr(fn, '__qualname__', fn)} declares no parameter {unknown}: pass them under its names")


def build_module(*args, **kwargs):
    return lambda cls: cls(*args, **kwargs).to(DEVICE, torch.bfloat16)


def build_rotary(cls):
    return cls(dim=MODULE["D"]).to(DEVICE)


def call_rotary(module, kwargs):
    return module(kwargs["q"], kwargs["k"])


def call_norm_module(module, kwargs):  # the peer's modules carry their own weight
    return module(kwargs["x"], kwargs["g"]) if "g" in kwargs else module(kwargs["x"])


def call_conv(fn, kwargs):
    return strict_call(fn, {**kwargs, "activation": "silu"})


def call_eps(fn, kwargs):
    return strict_call(fn, {**kwargs, "eps": 1e-6})


def rwkv6_inputs():
    """r, k, v and the bonus u in bf16, the log decay w in fp32 (as models keep it)."""
    B, T, H, K, V = LINEAR["B"], LINEAR["T"], LINEAR["H"], LINEAR["K"], LINEAR["V"]
    return dict(r=rand(B, T, H, K), k=rand(B, T, H, K), v=rand(B, T, H, V),
                w=F.logsigmoid(rand(B, T, H, K, dtype=torch.float32)) / 8, u=rand(H, K))


def hgrn_inputs():
    B, T, D = HGRN["B"], HGRN["T"], HGRN["D"]
    return dict(x=rand(B, T, D), g=F.logsigmoid(rand(B, T, D, dtype=torch.float32)).to(torch.bfloat16))


def attention_inputs(varlen: bool):
    def make():
        H, HKV, D = ATTENTION["H"], ATTENTION["HKV"], ATTENTION["D"]
        if not varlen:
            B, T = ATTENTION["B"], ATTENTION["T"]
            return dict(q=rand(B, T, H, D), k=rand(B, T, H, D), v=rand(B, T, H, D))
        lengths = ATTENTION["lengths"]
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        cu_seqlens = torch.tensor(offsets, device=DEVICE, dtype=torch.int64)
        T = offsets[-1]
        return dict(q=rand(1, T, H, D), k=rand(1, T, HKV, D), v=rand(1, T, HKV, D), cu_seqlens=cu_seqlens)

    return make


def attention_flops(varlen: bool):
    """Causal attention: q k^T and p v, each 2 D FLOPs per visible (query, key) pair, half
    of the T^2 pairs visible: ``2 * 2 * H * D * T^2 / 2`` per sequence forward. The backward
    has five such products (scores recomputed, dv, dp, dq, dk), 2.5 times the forward, so
    forward+backward counts 3.5 times it."""
    def count():
        H, D = ATTENTION["H"], ATTENTION["D"]
        squares = sum(n * n for n in ATTENTION["lengths"]) if varlen else ATTENTION["B"] * ATTENTION["T"] ** 2
        fwd = 2 * 2 * H * D * squares / 2
        return fwd, 3.5 * fwd

    return count


# SDPA's backends as torch.nn.attention.SDPBackend names them; "default": no context, the
# backend SDPA's own dispatch picks (what a user gets)
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "default": None}


def sdpa_backend(backend: str | None):
    """A context that restricts SDPA to ``backend`` (an ``SDPBackend`` name); None: none,
    SDPA's own dispatch."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    return contextlib.nullcontext() if backend is None else sdpa_kernel(getattr(SDPBackend, backend))


def sdpa_call(backend: str | None):
    """SDPA, dense causal, restricted to ``backend`` (``sdpa_backend``). Both sides take and
    return ``[B, T, H, D]``: SDPA reads the inputs as ``[B, H, T, D]`` through strides and
    its output goes back the same way, no copy on either side of the call; a copy the
    backend makes inside (a layout it does not take) is part of its time, as it is of a
    user's."""
    def call(fn, kwargs):
        q, k, v = (kwargs[n].transpose(1, 2) for n in ("q", "k", "v"))
        with sdpa_backend(backend):
            return fn(q, k, v, is_causal=True).transpose(1, 2)

    return call


# GatedDeltaNet layer: hidden 2048, 16 heads of 128 (value heads of 128), B=4, T=4096
LAYER = dict(hidden_size=2048, head_dim=128, num_heads=16, expand_v=1.0, conv_size=4, use_gate=True,
             mode="chunk", norm_eps=1e-5)
# the layer's defaults: 6 heads of 256, value heads of 512 (expand_v 2)
LAYER_DEFAULTS = {**LAYER, "head_dim": 256, "num_heads": 6, "expand_v": 2.0}
LAYER_SHAPE = dict(B=4, T=4096)


def layer_inputs():
    return dict(x=rand(LAYER_SHAPE["B"], LAYER_SHAPE["T"], LAYER["hidden_size"]))


def build_layer(cls, config=LAYER):
    """The layer at the sizes of ``config`` (the arguments its constructor accepts), in
    bf16, built once outside the timing."""
    accepted = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in config.items() if k in accepted}).to(DEVICE, torch.bfloat16)


def call_layer(layer, kwargs):
    return layer(kwargs["x"])


class FlaCoreGatedDeltaNet(torch.nn.Module):
    """The GatedDeltaNet layer composed from fla-core's own pieces (its short convolution,
    gated RMS norm and chunk_gated_delta_rule), for a peer side where the package that
    ships ``fla.layers`` is not installed: the same steps and sizes as ours."""

    def __init__(self, rule, config=LAYER):
        super().__init__()
        from fla.modules import FusedRMSNormGated, ShortConvolution

        C, H, D = config["hidden_size"], config["num_heads"], config["head_dim"]
        DV = int(D * config["expand_v"])
        self.rule, self.H, self.D, self.DV = rule, H, D, DV
        linear = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.q_proj, self.k_proj = linear(C, H * D), linear(C, H * D)
        self.v_proj, self.g_proj = linear(C, H * DV), linear(C, H * DV)
        self.a_proj, self.b_proj = linear(C, H), linear(C, H)
        self.o_proj = linear(H * DV, C)
        self.A_log = torch.nn.Parameter(torch.empty(H).uniform_(1, 16).log())
        self.dt_bias = torch.nn.Parameter(torch.rand(H) * 0.1)
        self.q_conv, self.k_conv, self.v_conv = (ShortConvolution(n, config["conv_size"], activation="silu")
                                                 for n in (H * D, H * D, H * DV))
        self.o_norm = FusedRMSNormGated(DV, eps=config["norm_eps"])

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (conv(proj(x))[0].view(B, T, self.H, dim)
                   for conv, proj, dim in ((self.q_conv, self.q_proj, self.D), (self.k_conv, self.k_proj, self.D),
                                           (self.v_conv, self.v_proj, self.DV)))
        beta = self.b_proj(x).sigmoid()
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)
        o, _ = self.rule(q=q, k=k, v=v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        o = self.o_norm(o, self.g_proj(x).view(B, T, self.H, self.DV))
        return self.o_proj(o.reshape(B, T, -1))


def build_core_layer(rule, config=LAYER):
    return FlaCoreGatedDeltaNet(rule, config).to(DEVICE, torch.bfloat16)


D = MODULE["D"]
BENCHES = [
    Bench("chunk_simple_gla", "kernels.chunk_simple_gla", "fla.ops.simple_gla.chunk_simple_gla", linear_inputs("scalar"), ("q", "k", "v", "g"), flops=chunk_flops()),
    Bench("chunk_retention", "kernels.chunk_retention", "fla.ops.retention.chunk_retention", linear_inputs(), ("q", "k", "v"), flops=chunk_flops()),
    Bench("chunk_linear_attn", "kernels.chunk_linear_attn", "fla.ops.linear_attn.chunk_linear_attn", linear_inputs(), ("q", "k", "v"), flops=chunk_flops(), peer_call=with_kwargs(normalize=False)),
    Bench("chunk_gla", "kernels.chunk_gla", "fla.ops.gla.chunk_gla", linear_inputs("channel"), ("q", "k", "v", "g"), flops=chunk_flops()),
    Bench("chunk_delta_rule", "kernels.chunk_delta_rule", "fla.ops.delta_rule.chunk_delta_rule", linear_inputs(beta=True, normalize_k=True), ("q", "k", "v", "beta"), flops=chunk_flops(delta=True)),
    Bench("chunk_gated_delta_rule", "kernels.chunk_gated_delta_rule", "fla.ops.gated_delta_rule.chunk_gated_delta_rule", linear_inputs("scalar", beta=True, normalize_k=True), ("q", "k", "v", "g", "beta"), flops=chunk_flops(delta=True)),
    Bench("chunk_gated_delta_rule_v512", "kernels.chunk_gated_delta_rule", "fla.ops.gated_delta_rule.chunk_gated_delta_rule", linear_inputs("scalar", beta=True, normalize_k=True, dims=WIDE_V), ("q", "k", "v", "g", "beta"), flops=chunk_flops(delta=True, dims=WIDE_V),
          notes=["K = 256, V = 512 (shapes: wide_v)"]),
    Bench("fused_recurrent_linear_attn", "kernels.fused_recurrent_linear_attn", "fla.ops.linear_attn.fused_recurrent_linear_attn", linear_inputs(), ("q", "k", "v"), peer_call=with_kwargs(normalize=False)),
    Bench("fused_recurrent_simple_gla", "kernels.fused_recurrent_simple_gla", "fla.ops.simple_gla.fused_recurrent_simple_gla", linear_inputs("scalar"), ("q", "k", "v", "g")),
    Bench("fused_recurrent_gla", "kernels.fused_recurrent_gla", "fla.ops.gla.fused_recurrent_gla", linear_inputs("channel"), ("q", "k", "v", "g"), peer_call=renamed(g="gk")),
    Bench("fused_recurrent_delta_rule", "kernels.fused_recurrent_delta_rule", "fla.ops.delta_rule.fused_recurrent_delta_rule", linear_inputs(beta=True, normalize_k=True), ("q", "k", "v", "beta")),
    Bench("fused_recurrent_gated_delta_rule", "kernels.fused_recurrent_gated_delta_rule", "fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule", linear_inputs("scalar", beta=True, normalize_k=True), ("q", "k", "v", "g", "beta")),
    Bench("fused_recurrent_gated_delta_rule_v512", "kernels.fused_recurrent_gated_delta_rule", "fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule", linear_inputs("scalar", beta=True, normalize_k=True, dims=WIDE_V), ("q", "k", "v", "g", "beta"),
          notes=["K = 256, V = 512 (shapes: wide_v)"]),
    Bench("rotary", "kernels.RotaryEmbedding", "fla.modules.RotaryEmbedding", module_inputs("rotary"), ("q", "k"), rotary_floor(), call_rotary, call_rotary, build_rotary, build_rotary),
    Bench("l2norm", "kernels.l2norm", "fla.modules.l2norm.l2norm", module_inputs("x"), ("x",)),
    Bench("rms_norm", "kernels.rms_norm", "fla.modules.RMSNorm", module_inputs("norm"), ("x", "weight"), call=call_eps, peer_call=call_norm_module, peer_build=build_module(D, eps=1e-6)),
    Bench("rms_norm_gated", "kernels.rms_norm_gated", "fla.modules.FusedRMSNormGated", module_inputs("gated"), ("x", "g", "weight"), call=call_eps, peer_call=call_norm_module, peer_build=build_module(D, eps=1e-6)),
    Bench("rms_norm_gated_v512", "kernels.rms_norm_gated", "fla.modules.FusedRMSNormGated", module_inputs("gated", WIDE_MODULE), ("x", "g", "weight"), call=call_eps, peer_call=call_norm_module, peer_build=build_module(WIDE_MODULE["D"], eps=1e-6),
          notes=["D = 512, the GatedDeltaNet layer's default value head (shapes: wide_module)"]),
    *(Bench(f"rms_norm_gated_v{D}", "kernels.rms_norm_gated", "fla.modules.FusedRMSNormGated", module_inputs("gated", dims), ("x", "g", "weight"), call=call_eps, peer_call=call_norm_module,
            peer_build=build_module(D, eps=1e-6), notes=[f"D = {D}, H = {dims['H']} (shapes: gated_norm_widths)"]) for D, dims in GATED_NORM_WIDTHS.items()),
    Bench("causal_conv1d", "kernels.causal_conv1d", "fla.modules.causal_conv1d.causal_conv1d", module_inputs("conv"), ("x", "weight", "bias"), call=call_conv, peer_call=call_conv),
    Bench("parallel_attn_vs_sdpa", "kernels.parallel_attn", "torch.nn.functional.scaled_dot_product_attention", attention_inputs(False), ("q", "k", "v"),
          flops=attention_flops(False), peer_variants={name: sdpa_call(backend) for name, backend in SDPA_BACKENDS.items()},
          notes=["peer: torch SDPA, dense causal, each backend (flash, cudnn, efficient) and the default dispatch; "
                 "ratio against the fastest each round"]),
    Bench("parallel_attn_varlen", "kernels.parallel_attn", "fla.ops.attn.parallel_attn", attention_inputs(True), ("q", "k", "v"), flops=attention_flops(True)),
    Bench("chunk_rwkv6", "kernels.chunk_rwkv6", "fla.ops.rwkv6.chunk_rwkv6", rwkv6_inputs, ("r", "k", "v", "w", "u"), flops=chunk_flops()),
    Bench("fused_recurrent_rwkv6", "kernels.fused_recurrent_rwkv6", "fla.ops.rwkv6.fused_recurrent_rwkv6", rwkv6_inputs, ("r", "k", "v", "w", "u")),
    Bench("chunk_hgrn", "kernels.chunk_hgrn", "fla.ops.hgrn.chunk_hgrn", hgrn_inputs, ("x", "g")),
    Bench("fused_recurrent_hgrn", "kernels.fused_recurrent_hgrn", "fla.ops.hgrn.fused_recurrent_hgrn", hgrn_inputs, ("x", "g")),
    Bench("chunk_kda", "kernels.chunk_kda", "fla.ops.kda.chunk_kda", linear_inputs("channel", beta=True, normalize_k=True), ("q", "k", "v", "g", "beta"), flops=chunk_flops(delta=True)),
    Bench("gated_deltanet_layer", "kernels.layers.GatedDeltaNet", "fla.layers.GatedDeltaNet", layer_inputs, ("x",),
          call=call_layer, peer_call=call_layer, build=build_layer, peer_build=build_layer),
    Bench("gated_deltanet_layer_core", "kernels.layers.GatedDeltaNet", "fla.ops.gated_delta_rule.chunk_gated_delta_rule", layer_inputs, ("x",),
          call=call_layer, peer_call=call_layer, build=build_layer, peer_build=build_core_layer,
          notes=["peer: the layer composed from fla-core's ShortConvolution, FusedRMSNormGated, chunk_gated_delta_rule"]),
    Bench("gated_deltanet_layer_defaults_core", "kernels.layers.GatedDeltaNet", "fla.ops.gated_delta_rule.chunk_gated_delta_rule", layer_inputs, ("x",),
          call=call_layer, peer_call=call_layer, build=functools.partial(build_layer, config=LAYER_DEFAULTS),
          peer_build=functools.partial(build_core_layer, config=LAYER_DEFAULTS),
          notes=["the layer's default head dims: 6 heads of 256, value heads of 512 (shapes: layer_defaults)",
                 "peer: the layer composed from fla-core's ShortConvolution, FusedRMSNormGated, chunk_gated_delta_rule"]),
    Bench("chunk_rwkv7", "kernels.chunk_rwkv7", "fla.ops.rwkv7.chunk_rwkv7", dplr_inputs(("r", "w")), ("r", "w", "k", "v", "a", "b")),
    Bench("chunk_dplr_delta_rule", "kernels.chunk_dplr_delta_rule", "fla.ops.generalized_delta_rule.chunk_dplr_delta_rule", dplr_inputs(), ("q", "k", "v", "a", "b", "gk")),
    Bench("fused_recurrent_rwkv7", "kernels.fused_recurrent_rwkv7", "fla.ops.rwkv7.fused_recurrent_rwkv7", dplr_inputs(("r", "w")), ("r", "w", "k", "v", "a", "b")),
]


def tensors_of(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


class Side:
    """One side of a comparison: its callable, bound to the shared inputs, forward-only
    and forward+backward."""

    def __init__(self, obj, call, kwargs, grads):
        self.obj, self.call = obj, call
        self.kwargs = kwargs
        self.leaves = {n: kwargs[n].detach().clone().requires_grad_(True) for n in grads}
        self.train_kwargs = {**kwargs, **self.leaves}
        params = list(obj.parameters()) if isinstance(obj, torch.nn.Module) else []
        self.grad_tensors = list(self.leaves.values()) + [p for p in params if p.requires_grad]
        self.cotangents = None
        self._graphs = {}

    def forward(self):
        with torch.no_grad():
            return self.call(self.obj, dict(self.kwargs))

    def forward_backward(self):
        outs = tensors_of(self.call(self.obj, dict(self.train_kwargs)))
        if self.cotangents is None:
            self.cotangents = [torch.randn_like(o) for o in outs]
        torch.autograd.backward(outs, self.cotangents[: len(outs)])

    def call_as_timed(self, fn):
        """``fn`` as ``time_rounds`` runs it: gradients set to None first (do_bench's
        ``grad_to_none``), so none is accumulated into an earlier one."""
        if fn is self.forward:
            return fn

        def call():
            for t in self.grad_tensors:
                t.grad = None
            return fn()
        return call

    def graphed(self, mode: str):
        """The mode's call captured once in a CUDA graph, as the graph's replay: its kernels'
        time with no host time in it (as a model compiled with CUDA graphs runs it). Captured
        after warm-up calls on a side stream, gradients set to None before each call; the
        gradients then stay in the graph's memory, rewritten by every replay."""
        if mode not in self._graphs:
            fn = self.call_as_timed(self.forward if mode == "fwd" else self.forward_backward)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            self._graphs[mode] = graph.replay
        return self._graphs[mode]

    def moved_bytes(self, grads) -> tuple[int, int]:
        """Inputs read and outputs written; the backward reads the inputs and the output
        gradients and writes the input gradients."""
        inputs = sum(t.numel() * t.element_size() for t in self.kwargs.values() if isinstance(t, torch.Tensor))
        outputs = sum(t.numel() * t.element_size() for t in tensors_of(self.forward()))
        grads_out = sum(self.kwargs[n].numel() * self.kwargs[n].element_size() for n in grads)
        return inputs + outputs, 2 * inputs + 2 * outputs + grads_out


def side_specs(b: Bench) -> list:
    """(side name, dotted path, call, build) of ours and of the peer, or of each peer variant."""
    peers = ([(PEER_VARIANT + label, call) for label, call in b.peer_variants.items()] if b.peer_variants
             else [("peer", b.peer_call)])
    return [("ours", b.ours, b.call, b.build)] + [(name, b.peer, call, b.peer_build) for name, call in peers]


def make_side(path, call, build, kwargs, grads, warm_backward=True) -> tuple[Side | None, dict]:
    """Resolve, build and warm one side (its first calls compile and autotune, untimed)."""
    state = {}
    if path is None:
        return None, {"error": "no counterpart"}
    try:
        obj = resolve(path)
    except Exception as e:
        return None, {"error": "missing: " + first_line(e)[:200]}
    t0 = time.time()
    try:
        side = Side(build(obj) if build else obj, call or strict_call, kwargs, grads)
        side.forward()
    except Exception as e:
        traceback.print_exc(limit=3)
        return None, {"error": first_line(e)}
    if warm_backward:
        try:
            side.forward_backward()
        except Exception as e:  # a backward that refuses to run leaves the forward time standing
            state["bwd_error"] = first_line(e)
    state["warm_s"] = round(time.time() - t0, 1)
    return side, state


def time_rounds(sides: dict, mode: str, rounds: int, warmup_ms: int, rep_ms: int) -> dict:
    """Interleaved rounds: each round times every side once, the order alternating. A
    ``*_graph`` mode times the replay of the call captured in a CUDA graph."""
    from triton.testing import do_bench

    names = list(sides)
    samples = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            fn, grad_to_none = timed_call(sides[n], mode)
            samples[n].append(do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none, return_mode="median"))
    return samples


def timed_call(side, mode: str):
    """The callable that times ``side`` in ``mode`` (``fwd``, ``fwd_bwd``, or either with
    ``_graph``: the call's CUDA-graph replay), and the gradients ``do_bench`` clears
    between calls (an eager forward+backward's only: a replay's are its graph's own)."""
    base = mode.removesuffix("_graph")
    if mode != base:
        return side.graphed(base), None
    if base == "fwd":
        return side.forward, None
    return side.forward_backward, side.grad_tensors


PEER_VARIANT = "peer "  # a peer variant's side: "peer <label>"


def _ratio_of(peer: list, ours: list) -> dict:
    ratios = [p / o for p, o in zip(peer, ours)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def summarize(samples: dict) -> dict:
    """Per side its median and min-max over the rounds; the ratio peer / ours per round.
    With peer variants the peer's time each round is the fastest variant's that round
    (``peer``), ``fastest_peer`` the variant of the lowest median, and ``peer_ratios``
    each variant's own ratio."""
    variants = {n.removeprefix(PEER_VARIANT): s for n, s in samples.items() if n.startswith(PEER_VARIANT)}
    if variants:
        samples = {**samples, "peer": [min(times) for times in zip(*variants.values())]}
    out = {n: {"median_ms": statistics.median(s), "min_ms": min(s), "max_ms": max(s), "rounds_ms": s} for n, s in samples.items()}
    if "ours" in samples and "peer" in samples:
        out["ratio"] = _ratio_of(samples["peer"], samples["ours"])
    if variants:
        out["fastest_peer"] = min(variants, key=lambda n: statistics.median(variants[n]))
        if "ours" in samples:
            out["peer_ratios"] = {n: _ratio_of(s, samples["ours"]) for n, s in variants.items()}
    return out


MODES = ("fwd", "fwd_bwd")
GRAPH_MODES = ("fwd_graph", "fwd_bwd_graph")


def graph_ready(sides: dict, mode: str) -> tuple[dict, dict]:
    """The sides whose call captures in a CUDA graph, and why each other one does not."""
    ready, errors = {}, {}
    for n, side in sides.items():
        try:
            side.graphed(mode.removesuffix("_graph"))
            ready[n] = side
        except Exception as e:
            errors[n] = "capture: " + first_line(e)
    return ready, errors


def bench_op(b: Bench, rounds: int, warm_only=False, warmup_ms=25, rep_ms=100, graphs=False) -> dict:
    row = {"op": b.name}
    kwargs = b.inputs()
    sides = {}
    specs = side_specs(b)
    for name, path, call, build in specs:
        side, state = make_side(path, call, build, kwargs, b.grads)
        row[name] = state
        if side is not None:
            sides[name] = side
    if b.peer_variants and not any(n.startswith(PEER_VARIANT) for n in sides):
        row["peer"] = {"error": "every variant: " + row[specs[1][0]]["error"]}
    if warm_only or not sides:
        return row
    if "ours" in sides:
        row["bytes"] = b.floor_bytes or sides["ours"].moved_bytes(b.grads)
        if b.flops:
            row["flops"] = b.flops()
    for mode in MODES + (GRAPH_MODES if graphs else ()):
        timed = {n: s for n, s in sides.items() if not (mode.startswith("fwd_bwd") and "bwd_error" in row[n])}
        errors = {}
        if mode in GRAPH_MODES:
            timed, errors = graph_ready(timed, mode)
        if not timed:
            row[mode] = {"errors": errors} if errors else {}
            continue
        try:
            row[mode] = summarize(time_rounds(timed, mode, rounds, warmup_ms, rep_ms)) | ({"errors": errors} if errors else {})
        except Exception as e:
            traceback.print_exc(limit=3)
            row[mode] = {"error": first_line(e)}
    return row


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read plus bytes written)."""
    from triton.testing import do_bench

    x = torch.empty(2 * 1024**3 // 4, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=25, rep=100, return_mode="median")
    del x, y
    return 2 * 2 * 1024**3 / (ms * 1e-3)


def matmul_throughput() -> float:
    """Dense bf16 matmul FLOP/s (torch.matmul, 8192 cubed), the tensor-core floor's rate."""
    from triton.testing import do_bench

    n = 8192
    a, b = rand(n, n), rand(n, n)
    ms = do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")
    return 2 * n**3 / (ms * 1e-3)


def floors(row, rates) -> dict:
    """Per mode: the floor in ms, what bounds it, and ours as a fraction of it."""
    out = {}
    for mode in MODES + GRAPH_MODES:
        ours = row.get(mode, {}).get("ours")
        if not ours or "bytes" not in row:
            continue
        i = 0 if mode.removesuffix("_graph") == "fwd" else 1
        memory = row["bytes"][i] / rates["copy_Bps"] * 1e3
        compute = row["flops"][i] / rates["matmul_flops"] * 1e3 if "flops" in row else 0.0
        floor = max(memory, compute)
        out[mode] = {"floor_ms": floor, "bound": "tensor cores" if compute > memory else "memory",
                     "fraction": floor / ours["median_ms"]}
    return out


def load_rows(out_path) -> list:
    try:
        with open(out_path + ".json") as f:
            return json.load(f)["rows"]
    except (OSError, ValueError, KeyError):
        return []


@triton.jit
def _noop(x):
    pass


def issue_us(fn, calls: int = 200, rounds: int = 7) -> float:
    """Median over rounds of the CPU's microseconds to issue one call of ``fn`` (the GPU
    left to lag behind, synchronized between rounds)."""
    return host_timing.per_call_us(fn, calls, rounds, sync=torch.cuda.synchronize)


def host_state() -> dict:
    """The CPU that issues the launches, at the start: a line whose kernels take less time
    than the CPU needs to issue them is timed as host time, which moves with the machine's
    CPU and whatever else loads it. A no-op Triton launch's issue time measures the first,
    the 1-minute load average the second; each row also keeps the load while it ran."""
    x = torch.empty(16, device=DEVICE)
    return {"cpus": os.cpu_count(), "noop_launch_us": round(issue_us(lambda: _noop[(1,)](x)), 1),
            "load_average": round(os.getloadavg()[0], 2)}


def run(benches, out_path, rounds, resume=False, graphs=False):
    device = torch.cuda.get_device_name()
    rates = {"copy_Bps": copy_bandwidth(), "matmul_flops": matmul_throughput()}
    host = host_state()
    print(f"copy bandwidth {rates['copy_Bps'] / 1e12:.2f} TB/s, bf16 matmul {rates['matmul_flops'] / 1e12:.0f} TFLOP/s; "
          f"host: {host_line(host, [])}", flush=True)
    rows = [r for r in load_rows(out_path) if complete(r)] if (resume and out_path) else []
    done = {r["op"] for r in rows}
    table = write_report(device, rates, host, rounds, rows, out_path)
    for b in benches:
        if b.name in done:
            continue
        t0 = time.time()
        load = os.getloadavg()[0]
        row = bench_op(b, rounds, graphs=graphs)
        row["host_load"] = round(max(load, os.getloadavg()[0]), 2)  # the 1-minute load average, before or after
        row["floor"] = floors(row, rates)
        row["wall_s"] = round(time.time() - t0, 1)
        rows.append(row)
        torch.cuda.empty_cache()
        print(json.dumps({k: row[k] for k in ("op", "wall_s")} | {m: (row.get(m, {}).get("ratio")) for m in MODES + GRAPH_MODES if m in row}),
              flush=True)
        # written after every op, so a run cut short by a time limit keeps what it measured
        table = write_report(device, rates, host, rounds, rows, out_path)
    print(table)


def split_over_gpus(names: list, gpus: int) -> list:
    """The ops dealt to ``gpus`` timing processes in turn (neighbours in the bench's order,
    often one family's ops of like cost, land on different GPUs); no empty share."""
    return [names[i::gpus] for i in range(gpus) if names[i::gpus]]


def merged_report(reports: list, order: list) -> dict:
    """One report from the per-GPU runs' reports (``reports[i]`` from GPU i, None where a
    run left nothing): rows in ``order`` (op names), each tagged with its GPU; the header's
    device, rates and host are GPU 0's, every GPU's are kept in ``per_gpu``."""
    present = [(i, r) for i, r in enumerate(reports) if r]
    if not present:
        raise RuntimeError("no GPU's run left a report")
    rows = {row["op"]: {**row, "gpu": i} for i, r in present for row in r["rows"]}
    first = present[0][1]
    keys = ("device", "copy_bandwidth_TBps", "matmul_TFLOPs", "host", "command")
    return {**first, "rows": [rows[name] for name in order if name in rows],
            "per_gpu": [{"gpu": i, **{k: r.get(k) for k in keys}} for i, r in present],
            "command": " ".join(sys.argv)}


def run_on_gpus(names: list, gpus: int, out_path: str, child_args: list, command=None) -> dict:
    """Time ``names`` on ``gpus`` GPUs at once (``split_over_gpus``), one child process per
    GPU (``command(i, ops, out)``: its argv; by default this script with ``child_args``), and
    merge what they wrote. An interrupt (a time limit's SIGINT) is passed on to the children,
    which keep what they timed; the merge follows either way."""
    import signal
    import subprocess

    command = command or (lambda i, ops, out: [sys.executable, __file__, "--ops", ",".join(ops), "--out", out, *child_args])
    shares = split_over_gpus(names, gpus)
    children = []
    for i, ops in enumerate(shares):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(i)}
        children.append(subprocess.Popen(command(i, ops, f"{out_path}.gpu{i}"), env=env))
    try:
        for p in children:
            p.wait()
    except KeyboardInterrupt:
        # ``timeout`` signals the whole process group: give the children the signal's own
        # effect first, so that a second one does not cut a report being written
        deadline = time.time() + 10
        while time.time() < deadline and any(p.poll() is None for p in children):
            time.sleep(0.2)
        for p in children:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in children:
            p.wait()
    reports = []
    for i in range(len(shares)):
        try:
            with open(f"{out_path}.gpu{i}.json") as f:
                reports.append(json.load(f))
        except (OSError, ValueError):
            reports.append(None)
    report = merged_report(reports, names)
    with open(out_path + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(out_path + ".md", "w") as f:
        f.write(format_table(report) + "\n")
    return report


def complete(row) -> bool:
    """Timed already: ours ran, and its forward has a median."""
    return "error" not in row.get("ours", {}) and "ours" in row.get("fwd", {})


def write_report(device, rates, host, rounds, rows, out_path) -> str:
    report = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "device": device, "torch": torch.__version__, "triton": triton.__version__,
              "copy_bandwidth_TBps": rates["copy_Bps"] / 1e12, "matmul_TFLOPs": rates["matmul_flops"] / 1e12,
              "host": host,
              "rounds": rounds, "shapes": {"hgrn": HGRN, "linear": LINEAR, "wide_v": WIDE_V, "module": MODULE, "wide_module": WIDE_MODULE, "gated_norm_widths": GATED_NORM_WIDTHS, "conv": CONV, "chunk": CHUNK, "attention": ATTENTION,
                         "layer": {**LAYER, **LAYER_SHAPE}, "layer_defaults": {**LAYER_DEFAULTS, **LAYER_SHAPE}},
              "rows": rows, "command": " ".join(sys.argv)}
    table = format_table(report)
    if out_path:
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        with open(out_path + ".json", "w") as f:
            json.dump(report, f, indent=1)
        with open(out_path + ".md", "w") as f:
            f.write(table + "\n")
    return table

RUN_KEYS = ("date", "device", "torch", "triton", "copy_bandwidth_TBps", "matmul_TFLOPs", "host", "rounds", "per_gpu",
            "command")


def runs_of(report: dict) -> list:
    """A report's runs: those it names (a merged report), else the one that wrote it."""
    return report.get("runs") or [{k: report[k] for k in RUN_KEYS if k in report}]


def merged_runs(base: dict | None, new: dict, order: list) -> dict:
    """``new``'s rows in place of ``base``'s rows of the same ops (a partial re-run updates
    the rows it timed), the others kept; rows in ``order`` (op names; ops it lacks last),
    each naming its run (``row["run"]``, an index into ``runs``); a run left without a row
    is dropped. The header (device, rates, host, shapes) is ``new``'s."""
    by_op = {}
    for report in ([base] if base else []) + [new]:
        runs = runs_of(report)
        for row in report["rows"]:
            by_op[row["op"]] = (runs[row.get("run", 0)], row)
    names = [n for n in order if n in by_op] + [n for n in by_op if n not in order]
    runs, rows = [], []
    for name in names:
        run, row = by_op[name]
        if run not in runs:
            runs.append(run)
        rows.append({**row, "run": runs.index(run)})
    return {**new, "rows": rows, "runs": runs}


def read_report(path: str) -> dict | None:
    try:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            return json.load(f)
    except OSError:
        return None


def merge_into(run_path: str, stem: str, order: list) -> dict:
    """``--merge RUN --into <stem>``: ``merged_runs`` of ``<stem>.json.gz`` and RUN, written
    back as ``<stem>.json.gz`` and ``<stem>.md``."""
    new = read_report(run_path)
    if new is None:
        raise SystemExit(f"--merge: no report at {run_path}")
    report = merged_runs(read_report(stem + ".json.gz"), new, order)
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with gzip.open(stem + ".json.gz", "wt") as f:
        json.dump(report, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(format_table(report) + "\n")
    return report


def _run_lines(report) -> list:
    """For a merged report over several runs: each run's date, machine, rounds, host, command."""
    if len(report.get("runs", [])) < 2:
        return []
    lines = [f"Rows from {len(report['runs'])} runs (a later run's rows replace the same ops'), each row's in its last column:"]
    for i, run in enumerate(report["runs"]):
        rows = [row for row in report["rows"] if row.get("run") == i]
        host = f"; host: {host_line(run['host'], rows)}" if run.get("host") else ""
        lines.append(f"- run {i}: {run.get('date', 'undated')}, {run.get('device', '?')}, torch {run.get('torch', '?')}, "
                     f"triton {run.get('triton', '?')}, copy bandwidth {run.get('copy_bandwidth_TBps', 0):.2f} TB/s, "
                     f"{run.get('rounds', '?')} rounds, {len(rows)} ops{host}; "
                     f"`{run.get('command', '?')}`")
    return lines


def _ms(x):
    return "-" if x is None else (f"{x:.3f}" if x < 100 else f"{x:.0f}")


def _cell(row, mode, side):
    """A side's median, or why it has none; the peer's names its fastest variant."""
    timed = row.get(mode, {}).get(side)
    if timed:
        fastest = row[mode].get("fastest_peer") if side == "peer" else None
        return _ms(timed["median_ms"]) + (f" ({fastest})" if fastest else "")
    state = row.get(side, {})
    why = (state.get("error") or (state.get("bwd_error") if mode.startswith("fwd_bwd") else None)
           or row.get(mode, {}).get("errors", {}).get(side) or row.get(mode, {}).get("error") or "-")
    return why[:40]


def _ratio(row, mode):
    r = row.get(mode, {}).get("ratio")
    return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})" if r else "-"


def _floor(row, mode):
    f = row.get("floor", {}).get(mode)
    return f"{100 * f['fraction']:.0f}% of {f['floor_ms']:.3f} ({'TC' if f['bound'] == 'tensor cores' else 'mem'})" if f else "-"


def _tflops(row, mode):
    """Achieved TFLOP/s, ours / peer, for ops with a FLOP count."""
    if "flops" not in row:
        return "-"
    n = row["flops"][0 if mode.removesuffix("_graph") == "fwd" else 1]
    rates = [f"{n / (t['median_ms'] * 1e-3) / 1e12:.0f}" if t else "-"
             for t in (row.get(mode, {}).get(side) for side in ("ours", "peer"))]
    return " / ".join(rates)


def host_line(host: dict, rows: list) -> str:
    loads = [row["host_load"] for row in rows if "host_load" in row]
    text = (f"{host['cpus']} CPUs, a no-op Triton launch issued in {host['noop_launch_us']:.1f} us, "
            f"1-minute load average {host['load_average']:.2f} at the start")
    if loads:
        text += f", {min(loads):.2f}-{max(loads):.2f} while the ops were timed"
    return text + " (the bench itself counts about 1; host-bound lines move with these)"


def format_table(report) -> str:
    lines = [f"{report['device']}, torch {report['torch']}, triton {report['triton']}; copy bandwidth "
             f"{report['copy_bandwidth_TBps']:.2f} TB/s, bf16 matmul {report['matmul_TFLOPs']:.0f} TFLOP/s; bf16 inputs; "
             f"medians of {runs_rounds(report)} interleaved rounds; ratio = peer / ours (>1: ours faster), median (min-max over rounds); "
             "floor: ours as % of the op's floor in ms (mem: bytes / copy bandwidth; TC: FLOPs / matmul rate); "
             "TFLOP/s: achieved, ours / peer, where the op has a FLOP count",
             *([f"Host: {host_line(report['host'], report['rows'])}"] if report.get("host") and not _run_lines(report) else []),
             *_per_gpu_lines(report),
             *_run_lines(report),
             ""]
    header = ["| op | ours fwd ms | peer fwd ms | fwd ratio | fwd floor | fwd TFLOP/s | ours fwd+bwd ms | peer fwd+bwd ms "
              "| fwd+bwd ratio | fwd+bwd floor | fwd+bwd TFLOP/s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    several = len(report.get("per_gpu", [])) > 1
    if several:
        header = [header[0] + " GPU |", header[1] + "---|"]
    merged = len(report.get("runs", [])) > 1
    if merged:
        header = [header[0] + " run |", header[1] + "---|"]
    lines += header
    for modes in (MODES, GRAPH_MODES):
        rows = [row for row in report["rows"] if any(m in row for m in modes)]
        if modes == GRAPH_MODES and rows:
            lines += ["", "Captured in a CUDA graph, each side's call replayed (the kernels' time, no host time in it):", "",
                      header[0].replace(" ms |", " graph ms |"), header[1]]
        for row in rows:
            cells = [row["op"]]
            for mode in modes:
                cells += [_cell(row, mode, "ours"), _cell(row, mode, "peer"), _ratio(row, mode), _floor(row, mode),
                          _tflops(row, mode)]
            if several:
                cells.append(str(row.get("gpu", "-")))
            if merged:
                cells.append(str(row.get("run", "-")))
            lines.append("| " + " | ".join(cells) + " |")
    variant_lines = [_variant_line(row, mode) for row in report["rows"] for mode in MODES + GRAPH_MODES
                     if row.get(mode, {}).get("peer_ratios")]
    if variant_lines:
        lines += ["", "Each peer variant: median ms, ratio to ours (median, min-max); the row's peer is the fastest each round:", "",
                  *variant_lines]
    return "\n".join(lines)


def runs_rounds(report) -> str:
    counts = sorted({run.get("rounds") for run in report.get("runs", [])} - {None}) or [report["rounds"]]
    return "/".join(str(n) for n in counts)


def _per_gpu_lines(report) -> list:
    """For a run over several GPUs (``--gpus``): each GPU's rates and host while it timed."""
    if len(report.get("per_gpu", [])) < 2:
        return []
    lines = [f"Timed on {len(report['per_gpu'])} GPUs at once, one process each (the op's GPU in its row's last column):"]
    for g in report["per_gpu"]:
        rows = [row for row in report["rows"] if row.get("gpu") == g["gpu"]]
        lines.append(f"- GPU {g['gpu']}: {g['device']}, copy bandwidth {g['copy_bandwidth_TBps']:.2f} TB/s, bf16 matmul "
                     f"{g['matmul_TFLOPs']:.0f} TFLOP/s; {len(rows)} ops; host: {host_line(g['host'], rows)}")
    return lines


def _variant_line(row, mode) -> str:
    timed = row[mode]
    cells = [f"{name} {_ms(timed[PEER_VARIANT + name]['median_ms'])} ({r['median']:.2f}x, {r['min']:.2f}-{r['max']:.2f})"
             for name, r in timed["peer_ratios"].items()]
    failed = [f"{n.removeprefix(PEER_VARIANT)}: {_cell(row, mode, n)}" for n in row
              if n.startswith(PEER_VARIANT) and n not in timed]
    return f"- {row['op']} {mode}: ours {_ms(timed['ours']['median_ms'])}; " + "; ".join(cells + failed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma list of op names (default: all)")
    parser.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per op and mode (default 5)")
    parser.add_argument("--resume", action="store_true", help="keep the ops already timed in <out>.json, time the rest")
    parser.add_argument("--graphs", action="store_true",
                        help="also time each side's call captured in a CUDA graph (its kernels without its host time)")
    parser.add_argument("--warm", type=int, default=0, metavar="JOBS",
                        help="first compile every op's kernels, JOBS ops at a time in separate processes "
                             "(autotune results of that phase are not kept), then time them one by one")
    parser.add_argument("--warm-limit", type=float, default=330, metavar="S", help="stop the warm-up after S seconds")
    parser.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--merge", metavar="RUN.json", help="with --into: no timing; RUN's rows into the one file (see above)")
    parser.add_argument("--into", metavar="STEM", help="the measurement's one file, <stem>.json.gz and <stem>.md")
    parser.add_argument("--gpus", type=int, default=1, metavar="N",
                        help="after the warm-up, time the ops on N GPUs at once, one process each (needs --out)")
    args = parser.parse_args()
    if bool(args.merge) != bool(args.into):
        parser.error("--merge and --into go together")
    if args.merge:
        print(format_table(merge_into(args.merge, args.into, [b.name for b in BENCHES])))
        return
    if args.gpus > 1 and not args.out:
        parser.error("--gpus needs --out: each GPU's process writes <out>.gpu<i>.*, merged into <out>.*")
    if args.gpus > 1 and args.gpus > torch.cuda.device_count():
        parser.error(f"--gpus {args.gpus}: this machine has {torch.cuda.device_count()} GPUs")
    by_name = {b.name: b for b in BENCHES}
    benches = [by_name[name] for name in args.ops.split(",")] if args.ops else BENCHES
    if args.warm_only:
        for b in benches:
            bench_op(b, 0, warm_only=True)
        return
    if args.resume and args.out:
        # neither the ops already timed nor those an earlier call's warm-up finished: their
        # kernels are in the Triton cache, and the timed run autotunes on its own anyway
        skip = {r["op"] for r in load_rows(args.out) if complete(r)} | warmed_ops(args.out)
        benches_to_warm = [b for b in benches if b.name not in skip]
    else:
        benches_to_warm = benches
    if args.warm and benches_to_warm:
        warm(benches_to_warm, args.warm, args.warm_limit, args.out)
    if args.gpus > 1:
        child_args = ["--rounds", str(args.rounds), *(["--resume"] if args.resume else []),
                      *(["--graphs"] if args.graphs else [])]
        print(format_table(run_on_gpus([b.name for b in benches], args.gpus, args.out, child_args)))
        return
    run(benches, args.out, args.rounds, args.resume, args.graphs)


def warmed_ops(out) -> set:
    """The ops whose warm-up finished in an earlier call with the same ``--out``."""
    path = f"{out}.warmed"
    if not out or not os.path.exists(path):
        return set()
    with open(path) as f:
        return {line.strip() for line in f if line.strip()}


def warm(benches, jobs, limit_s, out=None, script=None, extra=(), keep_autotune=False):
    """Fill the Triton cache with every kernel both sides compile, in parallel processes:
    compiling, not timing, is most of a first call (the peer's autotuning compiles tens of
    configs per kernel). The peer's on-disk autotune results are switched off here, so the
    timed run picks its configs on an idle GPU. Processes still running after ``limit_s``
    are stopped: the timed run compiles what they left. Each op whose warm-up finished is
    listed in ``<out>.warmed``, so that a resumed run warms only the rest (a second warm-up
    of 25 cached ops took 272 s on an H100, 2026-11-27). ``script``: another tool whose
    ``--ops NAME --warm-only`` (and ``extra``) does the same for its ops (op names in ``benches`` then);
    ``keep_autotune``: leave the peer's on-disk autotune results on, for a tool that times nothing."""
    import subprocess

    env = {**os.environ} if keep_autotune else {**os.environ, "FLA_CACHE_RESULTS": "0"}
    pending = [getattr(b, "name", b) for b in benches]
    running = []
    t0 = time.time()
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            running.append((name, subprocess.Popen([sys.executable, script or __file__, "--ops", name, "--warm-only", *extra], env=env,
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        still = []
        for name, p in running:
            code = p.poll()  # once: a process that ends between two polls would be missed
            if code is None:
                still.append((name, p))
            elif code == 0 and out:
                with open(f"{out}.warmed", "a") as f:
                    f.write(name + "\n")
        running = still
        if time.time() - t0 > limit_s:
            for _, p in running:
                p.kill()
            print(f"warm-up stopped at {limit_s} s: {len(running)} running, {len(pending)} not started", flush=True)
            break
        time.sleep(0.5)
    print(f"warm-up of {len(benches)} ops, {jobs} at a time: {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
