"""Our bf16 errors beside the peer library's (fla-core), both against the float64 reference.

    python3 benchmarks/peer_accuracy.py [--warm 8] [--max-ratio 1.2] [--ops chunk_rwkv7,chunk_kda] [--device cuda] [--dtype bf16]
        [--B 2 --T 300 --H 2 --K 64 --V 64] [--seed 0] [--budget-s 240] [--json PATH] [--peer-from JSON]
        [--no-worse-than JSON]

Per op (every op of ``specs.peer.ADAPTERS``, the four gated chunked ones
first), both sides get the same inputs, drawn by the op's spec (``realistic`` gates, an
initial state where the op takes one, the spec's first case's options) in ``--dtype``,
and the same upstream gradients (``pytest_fla.checks.run_with_grads``: drawn once, handed
to the peer and the reference). Each output and each input gradient is compared with the
float64 reference recurrence (``reference/``) run on the same rounded inputs.

``--peer-from`` takes the peer's errors from an earlier run's ``--json`` instead of running it
(the peer is fixed: its figures need measuring once, and its warm-up takes minutes). On the
CPU, whose emulated bf16 arithmetic gives the GPU's errors, that compares ours with the
peer's at the GPU size with no GPU (``tests/test_peer_accuracy.py``).

Where the peer's backward fails (fla-core 0.6.0 has none for some fused recurrences, and
refuses its gated chunked ones' on Hopper with Triton < 3.7.1), its outputs alone are
compared and its error is kept in ``peer_error``.

The error is the conformance checks' measure (``pytest_fla.checks.tolerance.errors``,
``docs/tolerances.md``): the relative RMS error ``||out - ref||_2 / ||ref||_2`` over the
whole tensor; ``max`` in the JSON is ``max|out - ref| / max|ref|``. The ratio is ours over
the peer's relative RMS error (below 1: ours is closer to the reference).

Sizes: ``--B/--T/--H/--K/--V`` replace the case's dims of those names (``D``, a module's
width, takes ``--K``; ``HV``, ``HKV`` take ``--H``), other dims stay the case's CPU ones. On a GPU
the defaults are B=2 T=300 H=2 K=V=64. The peer is ``import fla`` (install its wheel:
``benchmarks/gpu_run.sh`` puts ``.whl/*.whl`` on ``PYTHONPATH``); it queries the CUDA
driver on import, so on the CPU only ours runs (peer "n/a"), under ``TRITON_INTERPRET=1``
(set here) at B=1 T=130 H=1 K=V=32, with the interpreter's bf16 arithmetic made the GPU's
(``pytest_fla.targets.interpreter_bf16``). Ops run until ``--budget-s`` seconds have passed (the
peer autotunes on first call); those left are listed. The markdown table is printed last;
``--json`` writes every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

FIRST = ("chunk_dplr_delta_rule", "chunk_rwkv7", "chunk_kda", "chunk_rwkv6")  # issue 42's gap
GPU_DIMS = dict(B=2, T=300, H=2, K=64, V=64)
# --no-worse-than: how far above the recorded error a run may read and still be the same
# kernel (the CPU emulation reads the H200's errors within 1%)
RECORDED_SPREAD = 1.02
CPU_DIMS = dict(B=1, T=130, H=1, K=32, V=32)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma-separated op names (default: every op with a peer)")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda where available")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    for dim in GPU_DIMS:
        parser.add_argument(f"--{dim}", type=int, help=f"default {GPU_DIMS[dim]} (GPU), {CPU_DIMS[dim]} (CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=240.0, help="start no op after this many seconds")
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--warm", type=int, default=0, metavar="JOBS",
                        help="first run each op once, JOBS ops at a time in their own processes: the peer "
                        "autotunes every kernel on its first call, one config after another, minutes an op")
    parser.add_argument("--warm-limit", type=float, default=300, metavar="S", help="stop the warm-up after S seconds")
    parser.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--max-ratio", type=float, default=None,
                        help="exit 1 when any output or gradient's error is above this many times the peer's "
                        "(the aim: 1.2); errors below --floor count as the floor on both sides")
    parser.add_argument("--peer-from", metavar="JSON",
                        help="the peer's errors from an earlier run's --json (same dtype, dims and seed) instead of "
                        "running it; each row also gets that run's own error as recorded_ours")
    parser.add_argument("--no-worse-than", metavar="JSON",
                        help="an earlier run's --json (same dtype, dims, seed): a tensor over --max-ratio fails only "
                        "where its error is also above that run's by more than 2%% (a known gap is reported, a new "
                        "or larger one fails); one without a peer figure fails above it")
    parser.add_argument("--floor", type=float, default=1e-4,
                        help="relative errors below this are noise at bf16 for the --max-ratio gate (default 1e-4)")
    return parser.parse_args(argv)


def pick_device(wanted: str | None) -> str:
    if wanted is None:
        import torch

        wanted = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
    if wanted == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels' modules are imported
    return wanted


def case_for(spec, dims: dict):
    """The spec's first case that checks gradients, at ``dims``, with an initial state
    where the op takes one (the same dims on every device)."""
    from pytest_fla.ops.spec import Case

    case = next(c for c in spec.cases if c.checks is None or "backward" in c.checks)
    sizes = dict(case.dims)
    for name in ("B", "T", "H", "K", "V"):
        if name in sizes:
            sizes[name] = dims[name]
    if "D" in sizes:
        sizes["D"] = dims["K"]
    for grouped in ("HV", "HKV"):  # one value (key/value) head per query head
        if grouped in sizes:
            sizes[grouped] = sizes.get("H", dims["H"])
    options = dict(case.options)
    if "initial_state" in spec.args:
        options["initial_state"] = True
        if "final_state" in spec.outputs:
            options["output_final_state"] = True
    return dataclasses.replace(Case(case.name, sizes, "realistic", options), gpu_dims=None)


def compared(spec, result, reference, names) -> dict:
    """{tensor: (rel RMS, max)} of one side's outputs and input gradients."""
    from pytest_fla.checks.tolerance import errors

    (out, grads), (ref_out, ref_grads) = result, reference
    rows = {}
    for name, o, r in zip(spec.outputs, out, ref_out):
        if name is not None and o is not None and r is not None:
            rows[name] = errors(o, r)
    for name in names:
        if grads[name] is not None and ref_grads[name] is not None:
            rows[f"d{name}"] = errors(grads[name], ref_grads[name])
    return rows


def measure(spec, dims: dict, dtype: str, device: str, seed: int, peer: bool) -> list[dict]:
    """One op's rows: tensor, ours, peer (None where the peer did not run), their errors."""
    from pytest_fla.checks.generic import differentiable, run_with_grads
    from specs.peer import peer_spec

    case = case_for(spec, dims)
    sample = spec.sample(case, dtype, device, seed)
    names = differentiable(spec, sample)
    out, grads, upstream = run_with_grads(spec.op_fn, sample, names, seed=seed)
    ref_out, ref_grads, _ = run_with_grads(spec.reference_for(dtype), sample, names, upstream, upcast=True)
    reference = (ref_out, ref_grads)
    ours = compared(spec, (out, grads), reference, names)
    theirs, failure = {}, None
    if peer:
        try:
            peer_out, peer_grads, _ = run_with_grads(peer_spec(spec).op_fn, sample, names, upstream)
            theirs = compared(spec, (peer_out, peer_grads), reference, names)
        except Exception as e:  # the peer's failure is a finding of the run, not its end
            failure = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            try:  # a peer without a backward (or refusing one on this GPU) still has its outputs compared
                peer_out, _, _ = run_with_grads(peer_spec(spec).op_fn, sample, [], upstream)
                theirs = compared(spec, (peer_out, {}), reference, [])
            except Exception:
                pass
    rows = []
    for tensor, (rel, mx) in ours.items():
        peer_rel, peer_max = theirs.get(tensor, (None, None))
        rows.append(dict(op=spec.name, tensor=tensor, kind="backward" if tensor.startswith("d") else "forward",
                         case=case.name, dims=dict(case.dims), ours=rel, ours_max=mx, peer=peer_rel,
                         peer_max=peer_max, ratio=rel / peer_rel if peer_rel else None, peer_error=failure))
    return rows


def table(rows: list[dict]) -> str:
    def num(x):
        return "n/a" if x is None else f"{x:.2e}"

    out = ["| op | tensor | ours | peer | ratio |", "|---|---|---|---|---|"]
    for r in rows:
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        out.append(f"| {r['op']} | {r['tensor']} | {num(r['ours'])} | {num(r['peer'])} | {ratio} |")
    return "\n".join(out)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    emulated = None  # on the CPU: whether the interpreter does the GPU's bf16 arithmetic
    defaults = GPU_DIMS if device == "cuda" else CPU_DIMS
    dims = {d: getattr(args, d) if getattr(args, d) is not None else defaults[d] for d in GPU_DIMS}
    if device == "cpu":
        from pytest_fla.targets import interpreter, interpreter_bf16, interpreter_exp, interpreter_versions

        interpreter.skip_repeated_patching()
        interpreter_exp.install()
        interpreter_versions.install()
        emulated = interpreter_bf16.install()
        if not emulated:
            print("note: this Triton's interpreter could not be patched: its bf16 products are its own")
    from specs.peer import ADAPTERS, PEER
    from specs import all_specs

    specs = {s.name: s for s in all_specs() if s.name in ADAPTERS}
    chosen = args.ops.split(",") if args.ops else [*FIRST, *sorted(set(specs) - set(FIRST))]
    unknown = [op for op in chosen if op not in specs]
    if unknown:
        raise SystemExit(f"--ops: no op with a peer named {', '.join(unknown)} (known: {', '.join(sorted(specs))})")
    recorded = recorded_rows(args.peer_from, args.dtype, dims, args.seed) if args.peer_from else None
    peer = recorded is None and device == "cuda" and importlib.util.find_spec("fla") is not None
    why_no_peer = (f"recorded in {args.peer_from}" if recorded is not None else None if peer else
                   "the peer needs a GPU" if device == "cpu" else f"{PEER} is not importable")
    if args.warm_only:
        for op in chosen:
            measure(specs[op], dims, args.dtype, device, args.seed, peer)
        return 0
    print(f"{args.dtype} on {device}, dims {dims}, seed {args.seed}; peer: {PEER if peer else why_no_peer}")
    if args.warm and peer:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench

        same = ["--dtype", args.dtype, "--seed", str(args.seed), "--device", device,
                *(f"--{d}={dims[d]}" for d in dims)]
        bench.warm(chosen, args.warm, args.warm_limit, script=os.path.abspath(__file__), extra=same, keep_autotune=True)
    rows, failed, left = [], {}, []
    start = time.monotonic()
    for op in chosen:
        if time.monotonic() - start > args.budget_s:
            left.append(op)
            continue
        t0 = time.monotonic()
        try:
            got = measure(specs[op], dims, args.dtype, device, args.seed, peer)
        except Exception as e:
            traceback.print_exc()
            failed[op] = f"{type(e).__name__}: {e}"[:300]
            if "CUDA error" in str(e) or "Triton Error [CUDA]" in str(e):
                # the process's CUDA context is lost: every later op would fail the same way
                left = chosen[chosen.index(op) + 1:]
                print(f"{op}: a CUDA error ends the run (rerun the rest: --ops {','.join(left)})", flush=True)
                break
            continue
        if recorded is not None:
            got = [with_recorded(r, recorded.get((op, r["tensor"]))) for r in got]
        rows += got
        worst = max((r for r in got if r["kind"] == "backward"), key=lambda r: r["ours"], default=None)
        note = f", worst gradient {worst['tensor']} {worst['ours']:.2e}" if worst else ""
        print(f"{op}: {time.monotonic() - t0:.1f} s{note}", flush=True)
        if args.json:
            write(args.json, args, device, dims, rows, failed, left, why_no_peer, emulated)
    if args.json:
        write(args.json, args, device, dims, rows, failed, left, why_no_peer, emulated)
    for op, why in failed.items():
        print(f"{op}: failed: {why}")
    if left:
        print(f"not measured (past --budget-s {args.budget_s:.0f}, or after a CUDA error): {', '.join(left)}")
    print()
    print(table(rows))
    if not args.no_worse_than:
        known = {}
    elif args.no_worse_than == args.peer_from:  # the same run's record, read above
        known = recorded
    else:
        known = recorded_rows(args.no_worse_than, args.dtype, dims, args.seed)
    regressions = []
    for r in rows:
        before = known.get((r["op"], r["tensor"]))
        over = bool(args.max_ratio) and is_over(r, args.max_ratio, args.floor)
        worse = before is not None and max(r["ours"], args.floor) > RECORDED_SPREAD * max(before["ours"], args.floor)
        if over:
            note = "" if before is None else f" ({'above' if worse else 'as'} recorded: {before['ours']:.2e})"
            print(f"over {args.max_ratio}x the peer: {r['op']} {r['tensor']} {r['ours']:.2e} against {r['peer']:.2e}{note}")
        elif worse and r["peer"] is None:
            print(f"above the recorded error, no peer figure: {r['op']} {r['tensor']} {r['ours']:.2e} against {before['ours']:.2e}")
        if (over and (before is None or worse)) or (worse and r["peer"] is None):
            regressions.append(r)
    return 1 if failed or regressions else 0


def recorded_rows(path: str, dtype: str, dims: dict, seed: int) -> dict:
    """{(op, tensor): row} of an earlier run's --json, which must be at ``dtype``, ``dims``, ``seed``."""
    with open(path) as f:
        run = json.load(f)
    theirs = (run.get("dtype"), run.get("dims"), run.get("seed"))
    if theirs != (dtype, dims, seed):
        raise SystemExit(f"--peer-from {path}: recorded at dtype, dims, seed {theirs}, this run is at {(dtype, dims, seed)}")
    return {(r["op"], r["tensor"]): r for r in run["rows"]}


def with_recorded(row: dict, recorded: dict | None) -> dict:
    """``row`` with the peer's error (and the recorded run's own) from ``recorded``."""
    if recorded is None:
        return row
    peer = recorded["peer"]
    return {**row, "peer": peer, "peer_max": recorded["peer_max"], "peer_error": recorded["peer_error"],
            "ratio": row["ours"] / peer if peer else None, "recorded_ours": recorded["ours"]}


def is_over(row: dict, max_ratio: float, floor: float) -> bool:
    """Whether the row's error is above ``max_ratio`` times the peer's, each side at least ``floor``."""
    return row["peer"] is not None and max(row["ours"], floor) > max_ratio * max(row["peer"], floor)


def write(path, args, device, dims, rows, failed, left, why_no_peer, emulated):
    with open(path, "w") as f:
        json.dump(dict(dtype=args.dtype, device=device, dims=dims, seed=args.seed, peer_missing=why_no_peer,
                       gpu_bf16_emulated=emulated,
                       rows=rows, failed=failed, not_measured=left), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
