"""Where a test's time goes under compute-sanitizer: CUDA start-up, one test plainly, the same
test under memcheck with every kernel instrumented, and with only the kernels that are not
C++ (Triton's) instrumented. Also checks that the planted off-by-one read is still caught
with that filter. Runs the probes several at a time; prints one table last.

    python benchmarks/sanitizer_cost.py [--jobs 8] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAN = ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "20", "--error-exitcode", "0"]
# A mangled (C++) kernel name holds "_Z"; Triton's kernel names are plain identifiers.
NOT_CXX = ["--kernel-name-exclude", "kns=_Z"]
TESTS = [
    "test_forward[chunk_simple_gla-fp32-g]",
    "test_backward[chunk_simple_gla-bf16-g]",
    "test_varlen[chunk_simple_gla-fp32-chunk_edges-int32]",
    "test_huge_grid[chunk_simple_gla]",
    "test_int64_offsets[chunk_simple_gla]",
    "test_error_inputs[chunk_simple_gla-q_int]",
    "test_forward[fused_recurrent_simple_gla-bf16-g]",
    "test_backward[fused_recurrent_simple_gla-fp32-g]",
]
CUDA_START = "import torch; torch.zeros(1, device='cuda').sum().item()"
OFF_BY_ONE = (
    "import sys, torch; sys.path.insert(0, 'tests/plugin'); import faulty_kernels as f; "
    "x = torch.randn(1000, device='cuda'); f.off_by_one_read(x); torch.cuda.synchronize()"
)


def probes():
    py = [sys.executable]
    yield "cuda start", "plain", py + ["-c", CUDA_START]
    yield "cuda start", "memcheck", SAN + py + ["-c", CUDA_START]
    yield "off-by-one read", "memcheck", SAN + py + ["-c", OFF_BY_ONE]
    yield "off-by-one read", "memcheck, no C++ kernels", SAN + NOT_CXX + py + ["-c", OFF_BY_ONE]
    pytest = py + ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    for test in TESTS:
        node = f"tests/test_conformance.py::{test}"
        yield test, "plain", pytest + [node]
        yield test, "memcheck", SAN + pytest + [node]
        yield test, "memcheck, no C++ kernels", SAN + NOT_CXX + pytest + [node]


def run(label, mode, cmd, timeout):
    env = {**os.environ, "FLA_SMALL_SHAPES": "1", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDA_LAUNCH_BLOCKING": "1"}
    start = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
    seconds = time.perf_counter() - start
    summary = next((l for l in out.splitlines() if "ERROR SUMMARY" in l), "")
    invalid = next((l.strip("= ") for l in out.splitlines() if "Invalid" in l), "")
    tail = [l for l in out.splitlines() if l.strip()][-1:] or [""]
    return {"test": label, "mode": mode, "seconds": round(seconds, 1), "rc": rc,
            "summary": summary.strip("= "), "invalid": invalid, "tail": tail[0][-120:]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    help_text = subprocess.run(["compute-sanitizer", "--help"], capture_output=True, text=True).stdout
    lines = help_text.splitlines()
    for i, line in enumerate(lines):
        if "kernel-name" in line or "kernel-regex" in line:
            print("\n".join(lines[i : i + 8]))
            print("--")
    # the plain runs first: they compile each test's kernels into the Triton cache, so the
    # sanitizer runs time the checks, not the compiler
    every = list(probes())
    rows = []
    for phase in ([p for p in every if p[1] == "plain"], [p for p in every if p[1] != "plain"]):
        with ThreadPoolExecutor(args.jobs) as pool:
            rows += list(pool.map(lambda p: run(*p, args.timeout), phase))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "sanitizer_cost.json").write_text(json.dumps(rows, indent=1))
    print(f"{'test':56} {'mode':26} {'s':>6} {'rc':>7}  summary / last line")
    for r in rows:
        print(f"{r['test']:56} {r['mode']:26} {r['seconds']:6.1f} {str(r['rc']):>7}  {r['summary'] or r['tail']}  {r['invalid'][:80]}")


if __name__ == "__main__":
    main()
