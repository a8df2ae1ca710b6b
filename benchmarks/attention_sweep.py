"""parallel_attn's time per kernel config, beside every SDPA backend, on one GPU.

    python benchmarks/attention_sweep.py [--only fwd|dkdv|dq] [--match REGEX] [--dtype bf16] [--d 128]
                                         [--rounds 3] [--warm JOBS] [--budget S] [--no-combined] [--out FILE]

Each variant replaces one kernel's blocks ``(BM, BN, num_warps, num_stages[, descriptors])``
and keeps the others at the config the op picks today (``kernels.attention.parallel.CONFIGS``
for this GPU's arch); ``default`` is that config. Dense causal, B=4 T=4096 H=16 (HKV=16, as
SDPA sees it) at the given head dim. ``--only`` keeps one kernel's variants, ``--match`` those
whose label (e.g. ``dq (128, 64, 8, 3, True)``) the regular expression finds
(``--match 'True'``: the descriptor variants).

SDPA runs with each backend the machine offers (flash, cuDNN, efficient) and with no
backend named (its default dispatch), twice: on the bench's ``[B, T, H, D]`` tensors read
through strides (``bench.sdpa_call``: the layout ours takes, the comparison the bench
makes) and on contiguous ``[B, H, T, D]`` copies (its own layout, made outside the timing):
the difference is what the strided layout costs a backend. A backend that refuses the
inputs is reported with its error.

Everything is timed in ``--rounds`` interleaved rounds (``triton.testing.do_bench``
medians, the order alternating), forward and forward+backward; the table gives each line's
median with its min-max, TFLOP/s (forward ``2 * 2 * B * H * T^2 * D / 2``, forward+backward
3.5 times that) and its ratio to the fastest SDPA backend on the ``[B, T, H, D]`` tensors
(that backend's time / ours: 0.8 means ours takes 1.25 times as long). Unless
``--no-combined``, a last row ``combined`` takes each kernel's fastest variant (the
forward's by forward time, dk/dv's and dq's by forward+backward time) and is timed in
extra rounds beside the default and the fastest backend.

``--warm JOBS`` compiles the variants first in parallel processes (one per variant, into
the shared Triton cache); ``--budget S`` stops timing new variants after S seconds, so a
cut run still prints its table. A variant that fails to compile or run is reported with
its error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import kernels.attention.parallel as attn  # noqa: E402
from bench import SDPA_BACKENDS, sdpa_backend, sdpa_call  # noqa: E402

B, T, H = 4, 4096, 16
# Hopper candidates: 128-row query blocks on two warpgroups (8 warps), deeper pipelines,
# the walked-over tiles through tensor descriptors (TMA: the forward's and dq's k and v,
# dk/dv's q and do), and the smaller tiles the defaults came from. BN divides BM in the
# forward and dq, BM divides BN in dk/dv.
VARIANTS = {
    "fwd": [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (64, 64, 4, 4),
            (64, 32, 4, 3), (64, 64, 4, 3, True), (128, 64, 8, 3, True), (128, 128, 8, 3, True), (128, 64, 8, 4, True)],
    "dkdv": [(32, 128, 4, 3), (32, 128, 4, 5), (64, 128, 8, 2), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3),
             (32, 128, 8, 2), (64, 64, 4, 2, True), (64, 64, 4, 3, True), (32, 64, 4, 3, True), (64, 128, 8, 2, True),
             (64, 128, 8, 3, True), (32, 128, 8, 2, True), (64, 64, 8, 2, True)],
    "dq": [(128, 32, 4, 3), (128, 32, 4, 5), (128, 64, 8, 2), (128, 64, 8, 3), (64, 32, 4, 3), (64, 64, 4, 3),
           (64, 64, 4, 2, True), (64, 64, 4, 3, True), (128, 64, 8, 2, True), (128, 64, 8, 3, True),
           (128, 128, 8, 2, True), (64, 32, 4, 3, True), (128, 64, 8, 4, True), (128, 128, 8, 3, True),
           (128, 32, 8, 3, True), (128, 64, 4, 3, True)],
}
MODES = ("fwd", "fwd_bwd")


def variant_blocks(only=None, match=None) -> dict:
    """label -> (kernel, Blocks) of each variant (of kernel ``only``, whose label the regular
    expression ``match`` finds)."""
    return {label: (kernel, attn.Blocks(*b)) for kernel, blocks in VARIANTS.items() if not only or kernel == only
            for b in blocks for label in [f"{kernel} {b}"] if not match or re.search(match, label)}


def variant_configs(default, only=None, match=None) -> dict:
    """label -> AttentionConfigs: the default, then one kernel's blocks replaced at a time."""
    return {"default": default, **{label: dataclasses.replace(default, **{kernel: blocks})
                                   for label, (kernel, blocks) in variant_blocks(only, match).items()}}


class Line:
    """One timed line: a callable forward and forward+backward on shared inputs."""

    def __init__(self, fwd, fwd_bwd, grads, setup=lambda: None):
        self.fwd, self.fwd_bwd, self.grads, self.setup = fwd, fwd_bwd, grads, setup

    def time(self, mode: str) -> float:
        from triton.testing import do_bench

        self.setup()
        if mode == "fwd":
            with torch.no_grad():
                return do_bench(self.fwd, warmup=25, rep=100, return_mode="median")
        return do_bench(self.fwd_bwd, warmup=25, rep=100, grad_to_none=self.grads, return_mode="median")

    def warm(self):
        self.setup()
        with torch.no_grad():
            self.fwd()
        self.fwd_bwd()
        torch.cuda.synchronize()


def ours_line(q, k, v, do, cfg) -> Line:
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

    def setup():  # the op reads its configs at each call
        attn.attention_configs = lambda D, DV, dtype: cfg

    return Line(lambda: attn.parallel_attn(q, k, v), lambda: attn.parallel_attn(*leaves).backward(do), leaves, setup)


def sdpa_lines(q, k, v, do) -> dict:
    """Each backend on the ``[B, T, H, D]`` tensors (as the bench calls it) and on
    contiguous ``[B, H, T, D]`` copies."""
    lines = {}
    for name, backend in SDPA_BACKENDS.items():
        call = sdpa_call(backend)
        fn = torch.nn.functional.scaled_dot_product_attention
        bthd = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        lines[f"sdpa {name}"] = Line(lambda c=call: c(fn, dict(q=q, k=k, v=v)),
                                     lambda c=call, x=bthd: c(fn, dict(zip("qkv", x))).backward(do), bthd)
        native = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
        leaves = [t.detach().clone().requires_grad_(True) for t in native]
        do_native = do.transpose(1, 2).contiguous()
        plain = sdpa_native(backend)
        lines[f"sdpa {name} [B,H,T,D]"] = Line(lambda p=plain, x=native: p(*x),
                                               lambda p=plain, x=leaves: p(*x).backward(do_native), leaves)
    return lines


def sdpa_native(backend):
    """SDPA on contiguous ``[B, H, T, D]`` inputs, restricted to ``backend``."""
    def call(q, k, v):
        with sdpa_backend(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return call


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


def time_rounds(lines: dict, rounds: int, deadline: float, results: dict) -> None:
    """Interleaved rounds over ``lines`` (warmed), into ``results[label][mode]``; a line that
    fails gets ``error``. Stops at ``deadline`` (time.time())."""
    labels = [label for label in lines if "error" not in results.setdefault(label, {"fwd": [], "fwd_bwd": []})]
    for r in range(rounds):
        for label in (labels if r % 2 == 0 else labels[::-1]):
            if time.time() > deadline:
                return
            if "error" in results[label]:
                continue
            try:
                for mode in MODES:
                    results[label][mode].append(lines[label].time(mode))
            except Exception as e:  # noqa: BLE001 - reported per line
                results[label]["error"] = first_line(e)


def warm_lines(lines: dict, results: dict, deadline: float) -> dict:
    """The lines that compile and run once; the others get their error."""
    ready = {}
    for label, line in lines.items():
        if time.time() > deadline:
            results.setdefault(label, {})["error"] = "not timed: the time budget ran out"
            continue
        try:
            line.warm()
            ready[label] = line
        except Exception as e:  # noqa: BLE001 - reported per line
            results.setdefault(label, {})["error"] = first_line(e)
            if "CUDA" in results[label]["error"]:
                raise  # a fault leaves the context unusable: nothing after it would time
    return ready


def combined_config(default, results: dict, only=None, match=None):
    """Each kernel's fastest variant together (forward by forward time, the backward's
    kernels by forward+backward time); None where no variant beat the default."""
    def median(label, mode):
        times = results.get(label, {}).get(mode) or []
        return statistics.median(times) if times and "error" not in results[label] else float("inf")

    picks = {}
    variants = variant_blocks(only, match)
    for kernel, mode in (("fwd", "fwd"), ("dkdv", "fwd_bwd"), ("dq", "fwd_bwd")):
        best = min((label for label, (k, _) in variants.items() if k == kernel), key=lambda label: median(label, mode),
                   default=None)
        if best and median(best, mode) < median("default", mode):
            picks[kernel] = variants[best][1]
    return (dataclasses.replace(default, **picks), picks) if picks else (None, {})


def summary(times: list) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times)} if times else {}


def format_table(results: dict, flops: float, extra: list) -> str:
    stats = {label: {m: summary(r.get(m) or []) for m in MODES} for label, r in results.items() if "error" not in r}
    fastest = {}
    for mode in MODES:
        sdpa = [(s[mode]["median"], label) for label, s in stats.items()
                if label.startswith("sdpa ") and "[B,H,T,D]" not in label and s[mode]]
        fastest[mode] = min(sdpa) if sdpa else None
    lines = ["| line | fwd ms (min-max) | fwd TFLOP/s | fwd vs fastest SDPA | fwd+bwd ms (min-max) | fwd+bwd TFLOP/s "
             "| fwd+bwd vs fastest SDPA |", "|---|---|---|---|---|---|---|"]
    for label, r in results.items():
        if "error" in r:
            lines.append(f"| {label} | {r['error'][:80]} | | | | | |")
            continue
        cells = [label]
        for mode, work in (("fwd", flops), ("fwd_bwd", 3.5 * flops)):
            s = stats[label][mode]
            if not s:
                cells += ["-", "-", "-"]
                continue
            ratio = f"{fastest[mode][0] / s['median']:.2f}x" if fastest[mode] and not label.startswith("sdpa ") else "-"
            cells += [f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})", f"{work / s['median'] / 1e9:.0f}", ratio]
        lines.append("| " + " | ".join(cells) + " |")
    for mode in MODES:
        if fastest[mode]:
            lines.append(f"fastest SDPA {mode}: {fastest[mode][1]} {fastest[mode][0]:.3f} ms")
    return "\n".join(lines + extra)


def inputs(d: int, dtype):
    torch.manual_seed(0)
    return [torch.randn(B, T, H, d, device="cuda", dtype=dtype) for _ in range(4)]


def warm_children(labels: list, args, deadline: float) -> None:
    """Compile each variant in a process of its own, ``args.warm`` at a time."""
    def one(label):
        left = deadline - time.time()
        if left < 10:
            return label, "not compiled: the time budget ran out"
        cmd = [sys.executable, __file__, "--dtype", args.dtype, "--d", str(args.d), "--warm-only", label]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            return label, "compile timed out"
        return label, None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1][:200]

    t0 = time.time()
    with ThreadPoolExecutor(args.warm) as pool:
        for label, error in pool.map(one, labels):
            if error:
                print(f"warm {label}: {error}", flush=True)
    print(f"warm-up of {len(labels)} variants, {args.warm} at a time: {time.time() - t0:.0f} s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(VARIANTS), help="sweep one kernel's blocks only")
    parser.add_argument("--match", metavar="REGEX", help="sweep the variants whose label REGEX finds")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--d", type=int, default=128, help="head dim")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--warm", type=int, default=0, metavar="JOBS", help="compile the variants first, JOBS at a time")
    parser.add_argument("--budget", type=float, default=480, metavar="S", help="stop timing new lines after S seconds")
    parser.add_argument("--no-combined", action="store_true", help="no combined row of each kernel's fastest variant")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--warm-only", metavar="LABEL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    deadline = time.time() + args.budget
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    default = attn.attention_configs(args.d, args.d, dtype)
    configs = variant_configs(default, args.only, args.match)
    if args.warm_only:
        ours_line(*inputs(args.d, dtype), configs[args.warm_only]).warm()
        return
    if args.warm:
        warm_children(list(configs), args, deadline - 60)  # leaves a minute to time
    q, k, v, do = inputs(args.d, dtype)
    flops = 2 * 2 * B * H * T * T * args.d / 2
    results = {}
    lines = {**sdpa_lines(q, k, v, do), **{label: ours_line(q, k, v, do, cfg) for label, cfg in configs.items()}}
    # the combined row's rounds get the budget's last minute
    sweep_deadline = deadline - (0 if args.no_combined else 60)
    time_rounds(warm_lines(lines, results, sweep_deadline), args.rounds, sweep_deadline, results)
    extra = []
    if not args.no_combined:
        cfg, picks = combined_config(default, results, args.only, args.match)
        if cfg is None:
            extra.append("combined: no variant beat the default")
        else:
            extra.append("combined: " + ", ".join(f"{kernel} {dataclasses.astuple(b)}" for kernel, b in picks.items()))
            fastest_sdpa = min((label for label in results if label.startswith("sdpa ") and "[B,H,T,D]" not in label
                                and results[label].get("fwd") and "error" not in results[label]),
                               key=lambda label: statistics.median(results[label]["fwd"]), default=None)
            again = {"combined": ours_line(q, k, v, do, cfg), "default": lines["default"]}
            if fastest_sdpa:
                again[fastest_sdpa] = lines[fastest_sdpa]
            beside = {}
            time_rounds(warm_lines(again, beside, deadline), args.rounds, deadline, beside)
            # the combined rounds' lines under their own names: the same lines, timed again beside it
            results.update({(label if label == "combined" else f"{label} (beside combined)"): r for label, r in beside.items()})
    table = format_table(results, flops, extra)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "D": args.d,
                       "dtype": args.dtype, "B": B, "T": T, "H": H, "rounds": args.rounds,
                       "configs": {label: dataclasses.asdict(cfg) for label, cfg in configs.items()},
                       "results": results, "command": " ".join(sys.argv)}, f, indent=1)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; B={B} T={T} H={H} D={args.d} {args.dtype}, "
          f"dense causal; medians of {args.rounds} interleaved rounds")
    print(table)


if __name__ == "__main__":
    main()
