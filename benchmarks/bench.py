"""Time every op against the peer library (fla-core) on one GPU, in one run.

    python benchmarks/bench.py [--ops chunk_gla,l2norm] [--warm 8] [--out benchmarks/results/NAME]

For each op: forward and forward+backward medians (``triton.testing.do_bench``, median of
repeated runs after warm-up, on random inputs), ours and the peer's in the same process,
and their ratio (peer / ours: above 1 means ours is faster). Bandwidth-bound ops also get
the memory floor: the bytes they must move once, over the device-to-device copy bandwidth
measured at the start of the run. Ops missing on either side are reported as such.
Results go to ``<out>.json`` and ``<out>.md``; the table is printed last.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LINEAR = dict(B=4, T=4096, H=16, K=128, V=128)
MODULE = dict(B=8, T=4096, H=32, D=128)
CONV = dict(B=8, T=4096, D=4096, W=4)


@dataclass
class Bench:
    name: str
    ours: str                      # dotted path in this repo
    peer: str | None               # dotted path in fla, or None where it has no counterpart
    inputs: Callable[[], dict]     # keyword arguments, on the GPU
    grads: tuple[str, ...]         # inputs that get gradients in forward+backward
    # bytes moved by (forward, forward+backward) at the minimum, for bandwidth-bound ops
    floor_bytes: tuple[int, int] | None = None
    call: Callable | None = None   # how to call either side: call(fn, kwargs) -> outputs
    peer_call: Callable | None = None
    notes: list = field(default_factory=list)


def resolve(path: str):
    module, _, name = path.rpartition(".")
    obj = importlib.import_module(module)
    for part in name.split("/"):
        obj = getattr(obj, part)
    return obj


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)


def linear_inputs(gate: str | None = None, beta: bool = False, normalize_k: bool = False, gva: int = 1):
    def make():
        B, T, H, K, V = LINEAR["B"], LINEAR["T"], LINEAR["H"], LINEAR["K"], LINEAR["V"]
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
    """RWKV-7's inputs (OPS.md): kk a unit vector, a = -kk, b = kk * sigmoid, the log decay
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


def module_inputs(kind: str):
    def make():
        B, T, H, D = MODULE["B"], MODULE["T"], MODULE["H"], MODULE["D"]
        if kind == "rotary":
            return dict(q=rand(B, T, H, D), k=rand(B, T, H, D))
        if kind == "gated":
            return dict(x=rand(B, T, H, D), g=rand(B, T, H, D))
        if kind == "conv":
            B, T, D, W = CONV["B"], CONV["T"], CONV["D"], CONV["W"]
            return dict(x=rand(B, T, D), weight=rand(D, W), bias=rand(D))
        return dict(x=rand(B, T, H, D))

    return make


def _bytes(*numels, itemsize=2):
    return sum(numels) * itemsize


def _module_floor(kind):
    B, T, H, D = MODULE["B"], MODULE["T"], MODULE["H"], MODULE["D"]
    n = B * T * H * D
    if kind == "rotary":  # read q, k; write q, k. Backward: read dq, dk; write dq, dk
        return _bytes(4 * n), _bytes(8 * n)
    if kind == "gated":  # read x, g; write y. Backward: read x, g, dy; write dx, dg
        return _bytes(3 * n), _bytes(3 * n + 5 * n)
    if kind == "conv":
        m = CONV["B"] * CONV["T"] * CONV["D"]
        return _bytes(2 * m), _bytes(2 * m + 3 * m)
    return _bytes(2 * n), _bytes(2 * n + 3 * n)  # read x, write y; bwd read x, dy, write dx


def call_rotary(cls, kwargs):
    module = cls(dim=MODULE["D"]).cuda()
    return module(kwargs["q"], kwargs["k"])


def call_rmsnorm(cls, kwargs):
    return cls(MODULE["D"], eps=1e-6).cuda().to(torch.bfloat16)(kwargs["x"])


def call_rmsnorm_gated(cls, kwargs):
    return cls(MODULE["D"], eps=1e-6).cuda().to(torch.bfloat16)(kwargs["x"], kwargs["g"])


def call_conv(fn, kwargs):
    return fn(kwargs["x"], kwargs["weight"], kwargs["bias"], activation="silu")


def call_ours_rmsnorm(fn, kwargs):
    return fn(kwargs["x"], eps=1e-6)


def call_ours_rmsnorm_gated(fn, kwargs):
    return fn(kwargs["x"], kwargs["g"], eps=1e-6)


BENCHES = [
    Bench("chunk_simple_gla", "kernels.chunk_simple_gla", "fla.ops.simple_gla.chunk_simple_gla", linear_inputs("scalar"), ("q", "k", "v", "g")),
    Bench("chunk_retention", "kernels.chunk_retention", "fla.ops.retention.chunk_retention", linear_inputs(), ("q", "k", "v")),
    Bench("chunk_linear_attn", "kernels.chunk_linear_attn", "fla.ops.linear_attn.chunk_linear_attn", linear_inputs(), ("q", "k", "v")),
    Bench("chunk_gla", "kernels.chunk_gla", "fla.ops.gla.chunk_gla", linear_inputs("channel"), ("q", "k", "v", "g")),
    Bench("chunk_delta_rule", "kernels.chunk_delta_rule", "fla.ops.delta_rule.chunk_delta_rule", linear_inputs(beta=True, normalize_k=True), ("q", "k", "v", "beta")),
    Bench("chunk_gated_delta_rule", "kernels.chunk_gated_delta_rule", "fla.ops.gated_delta_rule.chunk_gated_delta_rule", linear_inputs("scalar", beta=True, normalize_k=True), ("q", "k", "v", "g", "beta")),
    Bench("fused_recurrent_linear_attn", "kernels.fused_recurrent_linear_attn", "fla.ops.linear_attn.fused_recurrent_linear_attn", linear_inputs(), ("q", "k", "v")),
    Bench("fused_recurrent_simple_gla", "kernels.fused_recurrent_simple_gla", "fla.ops.simple_gla.fused_recurrent_simple_gla", linear_inputs("scalar"), ("q", "k", "v", "g")),
    Bench("fused_recurrent_gla", "kernels.fused_recurrent_gla", "fla.ops.gla.fused_recurrent_gla", linear_inputs("channel"), ("q", "k", "v", "g")),
    Bench("fused_recurrent_delta_rule", "kernels.fused_recurrent_delta_rule", "fla.ops.delta_rule.fused_recurrent_delta_rule", linear_inputs(beta=True, normalize_k=True), ("q", "k", "v", "beta")),
    Bench("fused_recurrent_gated_delta_rule", "kernels.fused_recurrent_gated_delta_rule", "fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule", linear_inputs("scalar", beta=True, normalize_k=True), ("q", "k", "v", "g", "beta")),
    Bench("rotary", "kernels.RotaryEmbedding", "fla.modules.RotaryEmbedding", module_inputs("rotary"), ("q", "k"), _module_floor("rotary"), call_rotary, call_rotary),
    Bench("l2norm", "kernels.l2norm", "fla.modules.l2norm.l2norm", module_inputs("x"), ("x",), _module_floor("x")),
    Bench("rms_norm", "kernels.rms_norm", "fla.modules.RMSNorm", module_inputs("x"), ("x",), _module_floor("x"), call_ours_rmsnorm, call_rmsnorm),
    Bench("rms_norm_gated", "kernels.rms_norm_gated", "fla.modules.FusedRMSNormGated", module_inputs("gated"), ("x", "g"), _module_floor("gated"), call_ours_rmsnorm_gated, call_rmsnorm_gated),
    Bench("causal_conv1d", "kernels.causal_conv1d", "fla.modules.causal_conv1d.causal_conv1d", module_inputs("conv"), ("x", "weight", "bias"), _module_floor("conv"), call_conv, call_conv),
    Bench("chunk_rwkv7", "kernels.chunk_rwkv7", "fla.ops.rwkv7.chunk_rwkv7", dplr_inputs(("r", "w")), ("r", "w", "k", "v", "a", "b")),
    Bench("chunk_dplr_delta_rule", "kernels.chunk_dplr_delta_rule", "fla.ops.generalized_delta_rule.chunk_dplr_delta_rule", dplr_inputs(), ("q", "k", "v", "a", "b", "gk")),
    Bench("fused_recurrent_rwkv7", "kernels.fused_recurrent_rwkv7", "fla.ops.rwkv7.fused_recurrent_rwkv7", dplr_inputs(("r", "w")), ("r", "w", "k", "v", "a", "b")),
]


def default_call(fn, kwargs):
    params = inspect.signature(fn).parameters
    if "normalize" in params:  # the peer's linear attention normalises by default; OPS.md's does not
        kwargs = {**kwargs, "normalize": False}
    return fn(**kwargs)


def tensors_of(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]


def time_side(fn, call, make_inputs, grads, warm_only=False) -> dict:
    from triton.testing import do_bench

    kwargs = make_inputs()
    result = {}
    with torch.no_grad():
        call(fn, dict(kwargs))  # compile / autotune outside the timing
        if not warm_only:
            result["fwd_ms"] = do_bench(lambda: call(fn, dict(kwargs)), warmup=25, rep=200, return_mode="median")
    leaves = {n: kwargs[n].detach().clone().requires_grad_(True) for n in grads}
    kw = {**kwargs, **leaves}
    outs = tensors_of(call(fn, dict(kw)))
    cot = [torch.randn_like(o) for o in outs]

    def fwd_bwd():
        o = tensors_of(call(fn, dict(kw)))
        torch.autograd.backward(o, cot[: len(o)])

    try:  # a backward that refuses to run still leaves the forward time standing
        fwd_bwd()
    except Exception as e:
        result["bwd_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        return result
    if warm_only:
        return result
    result["fwd_bwd_ms"] = do_bench(fwd_bwd, warmup=25, rep=200, grad_to_none=list(leaves.values()), return_mode="median")
    return result


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read plus bytes written)."""
    from triton.testing import do_bench

    x = torch.empty(2 * 1024**3 // 4, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=25, rep=100, return_mode="median")
    return 2 * x.numel() * 4 / (ms * 1e-3)


def run(benches, out_path, warm_only=False):
    device = torch.cuda.get_device_name()
    bandwidth = 0.0 if warm_only else copy_bandwidth()
    rows, table = [], ""
    for b in benches:
        row = {"op": b.name}
        for side, path, call in (("ours", b.ours, b.call), ("peer", b.peer, b.peer_call)):
            if path is None:
                row[side] = {"error": "no counterpart"}
                continue
            try:
                fn = resolve(path)
            except Exception as e:  # missing on this side
                row[side] = {"error": f"missing: {type(e).__name__}: {e}"[:200]}
                continue
            t0 = time.time()
            try:
                row[side] = time_side(fn, call or default_call, b.inputs, b.grads, warm_only)
            except Exception as e:
                row[side] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
                traceback.print_exc(limit=2)
            row[side]["wall_s"] = round(time.time() - t0, 1)
            torch.cuda.empty_cache()
        if b.floor_bytes and bandwidth:
            row["floor_ms"] = [1e3 * n / bandwidth for n in b.floor_bytes]
        rows.append(row)
        print(json.dumps(row), flush=True)
        # written after every row, so a run cut short by a time limit keeps what it measured
        table = write_report(device, bandwidth, rows, out_path)
    print(table)


def write_report(device, bandwidth, rows, out_path) -> str:
    report = {"device": device, "torch": torch.__version__, "triton": __import__("triton").__version__,
              "copy_bandwidth_TBps": bandwidth / 1e12, "shapes": {"linear": LINEAR, "module": MODULE, "conv": CONV},
              "rows": rows, "command": " ".join(sys.argv)}
    table = format_table(report)
    if out_path:
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        with open(out_path + ".json", "w") as f:
            json.dump(report, f, indent=1)
        with open(out_path + ".md", "w") as f:
            f.write(table + "\n")
    return table


def _fmt(x):
    return "-" if x is None else (f"{x:.3f}" if x < 100 else f"{x:.0f}")


def format_table(report) -> str:
    lines = [f"{report['device']}, torch {report['torch']}, triton {report['triton']}, "
             f"copy bandwidth {report['copy_bandwidth_TBps']:.2f} TB/s; bf16; ratio = peer / ours (>1: ours faster)",
             "",
             "| op | ours fwd ms | peer fwd ms | fwd ratio | ours fwd+bwd ms | peer fwd+bwd ms | fwd+bwd ratio | floor fwd / fwd+bwd ms | ours % of floor (fwd, fwd+bwd) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        ours, peer = row.get("ours", {}), row.get("peer", {})
        cells = [row["op"]]
        for key in ("fwd_ms", "fwd_bwd_ms"):
            o, p = ours.get(key), peer.get(key)
            why = "error" if key == "fwd_ms" else "bwd_error"
            cells += [_fmt(o) if o else ours.get(why, ours.get("error", "-"))[:40],
                      _fmt(p) if p else peer.get(why, peer.get("error", "-"))[:40],
                      f"{p / o:.2f}x" if (o and p) else "-"]
        # reorder: fwd triple then fwd+bwd triple already in order
        floor = row.get("floor_ms")
        if floor:
            cells.append(f"{floor[0]:.3f} / {floor[1]:.3f}")
            pct = [f"{100 * f / ours[k]:.0f}%" if ours.get(k) else "-" for f, k in zip(floor, ("fwd_ms", "fwd_bwd_ms"))]
            cells.append(", ".join(pct))
        else:
            cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma list of op names (default: all)")
    parser.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    parser.add_argument("--warm", type=int, default=0, metavar="JOBS",
                        help="first compile every op's kernels, JOBS ops at a time in separate processes "
                             "(autotune results of that phase are not kept), then time them one by one")
    parser.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    by_name = {b.name: b for b in BENCHES}
    benches = [by_name[name] for name in args.ops.split(",")] if args.ops else BENCHES
    if args.warm:
        warm(benches, args.warm)
    run(benches, args.out, args.warm_only)


def warm(benches, jobs):
    """Fill the Triton cache with every kernel both sides compile, in parallel processes:
    compiling, not timing, is most of a first call (the peer's autotuning compiles tens of
    configs per kernel). The peer's on-disk autotune results are switched off here, so the
    timed run picks its configs on an idle GPU."""
    import subprocess

    env = {**os.environ, "FLA_CACHE_RESULTS": "0"}
    pending = [b.name for b in benches]
    running = []
    t0 = time.time()
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            running.append(subprocess.Popen([sys.executable, __file__, "--ops", name, "--warm-only"], env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        running = [p for p in running if p.poll() is None]
        time.sleep(0.5)
    print(f"warm-up of {len(benches)} ops, {jobs} at a time: {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
