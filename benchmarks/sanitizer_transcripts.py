"""Record what the real compute-sanitizer prints: every tool over planted programs.

Each tool (memcheck, racecheck, initcheck, synccheck) runs each scenario below with the
plugin's own command line and environment (``pytest_fla.sanitizer.command``/``environment``),
and the raw stdout, stderr and exit status of every run are written to one directory with a
``manifest.json``. The plugin's CPU tests replay these transcripts through their stand-in
``compute-sanitizer`` (``tests/plugin/sanitizer_transcripts/``), so the stand-in prints what the
installed tool printed, and re-recording on a new tool version shows what changed.

    python benchmarks/sanitizer_transcripts.py --out DIR [--jobs 8] [--scenarios a,b]

Needs a CUDA GPU and compute-sanitizer on the PATH. Prints a table last.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_fla import environment, sanitizer  # noqa: E402

PRELUDE = "import os, signal, sys, torch\nimport faulty_kernels as fk\n"

# name -> (program, what each tool is expected to make of it: "clean" or the tool that reports)
SCENARIOS = {
    # correct kernels: a copy, a cross-warp reduction (Triton's shared memory and barriers),
    # a pipelined fp16 matmul (async copies; wgmma on sm90)
    "clean": (PRELUDE + (
        "x = torch.arange(1000.0, device='cuda')\n"
        "assert torch.equal(fk.copy(x), x)\n"
        "m = torch.randn(64, 1000, device='cuda')\n"
        "torch.testing.assert_close(fk.row_sums(m), m.sum(1), rtol=1e-4, atol=1e-3)\n"
        "a = torch.randn(256, 256, device='cuda', dtype=torch.float16)\n"
        "torch.testing.assert_close(fk.shared_hungry_matmul(a, a).float(), a.float() @ a.float(), rtol=2e-2, atol=2e-1)\n"
        "torch.cuda.synchronize(); print('clean: done')\n"), "clean"),
    "oob_read": (PRELUDE + "x = torch.arange(1000.0, device='cuda')\nfk.off_by_one_read(x); torch.cuda.synchronize()\n", "memcheck"),
    "oob_store": (PRELUDE + "x = torch.arange(1000.0, device='cuda')\nfk.off_by_one_store(x); torch.cuda.synchronize()\n", "memcheck"),
    "shared_race": (PRELUDE + "x = torch.arange(128, device='cuda', dtype=torch.int32)\n"
                    "fk.shared_memory_race(x); torch.cuda.synchronize()\n", "racecheck"),
    # hazards between warps that store and load one value: how racecheck grades them
    "same_value_race": (PRELUDE + "x = torch.arange(128, device='cuda', dtype=torch.int32)\n"
                        "fk.same_value_shared_race(x); torch.cuda.synchronize()\n", "racecheck"),
    "divergent_barrier": (PRELUDE + "x = torch.arange(32, device='cuda', dtype=torch.int32)\n"
                          "fk.divergent_barrier(x); torch.cuda.synchronize()\n", "synccheck"),
    "uninitialised_read": (PRELUDE + "fk.uninitialised_read(1000, 'cuda'); torch.cuda.synchronize()\n", "initcheck"),
    # a program that never calls CUDA: what a compile-only check is under the tool
    "no_cuda_call": ("import torch, triton\nprint('compiled offline, nothing launched')\n", "clean"),
    # a program that ends badly after using the device: a non-zero exit, and a signal
    "exit_status_3": (PRELUDE + "x = torch.arange(1000.0, device='cuda')\nfk.copy(x); torch.cuda.synchronize()\nsys.exit(3)\n", "clean"),
    "killed_by_signal": (PRELUDE + "x = torch.arange(1000.0, device='cuda')\nfk.copy(x); torch.cuda.synchronize()\n"
                         "sys.stdout.flush(); os.kill(os.getpid(), signal.SIGKILL)\n", "clean"),
}

# Real ops through the plugin's child command: the varlen checks of the ops whose racecheck
# verdicts were wrong, and a compile-only reproducer (it makes no CUDA call).
PYTEST_SCENARIOS = {
    "op_varlen": ["-m", "pytest", "tests/test_conformance.py", "-q", "-p", "no:randomly", "-p", "no:xdist",
                  "-p", "no:cacheprovider", "--fla-ops=chunk_kda,chunk_rwkv7,parallel_attn", "-k", "varlen and bf16 and int32"],
    "repro_compile_only": ["-m", "pytest_fla", "run-repro", "tests/repro/compiled_everywhere_but_sm86.py", "--expect", "pass"],
}


TIMEOUT_SECONDS = 150  # a barrier only some lanes reach may hang the kernel


def run_one(tool: str, scenario: str, offset: int, workdir: Path) -> dict:
    env = dict(os.environ, **sanitizer.environment(), **{environment.SANITIZER_PORT_OFFSET: str(offset)},
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "plugin"), os.environ.get("PYTHONPATH", "")]))
    os.environ[environment.SANITIZER_PORT_OFFSET] = str(offset)  # command() reads it from this process
    if scenario in SCENARIOS:
        script = workdir / f"{scenario}.py"
        script.write_text(SCENARIOS[scenario][0])
        program = [sys.executable, str(script)]
    else:
        program = [sys.executable, *PYTEST_SCENARIOS[scenario]]
    command = sanitizer.command(tool) + program
    start = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=TIMEOUT_SECONDS)
        stdout, stderr, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as error:
        stdout = error.stdout.decode() if isinstance(error.stdout, bytes) else (error.stdout or "")
        stderr = error.stderr.decode() if isinstance(error.stderr, bytes) else (error.stderr or "")
        code = "timeout"
    return {"tool": tool, "scenario": scenario, "command": command, "exit": code,
            "seconds": round(time.time() - start, 1), "stdout": stdout, "stderr": stderr}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--tools", default=",".join(sanitizer.TOOLS))
    parser.add_argument("--scenarios", default=",".join([*SCENARIOS, *PYTEST_SCENARIOS]))
    args = parser.parse_args()
    if sanitizer.executable() is None:
        print("compute-sanitizer is not on the PATH")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = args.out / "programs"
    workdir.mkdir(exist_ok=True)
    version = subprocess.run([sanitizer.executable(), "--version"], capture_output=True, text=True).stdout.strip()
    runs = [(tool, scenario) for tool in args.tools.split(",") for scenario in args.scenarios.split(",")]
    results = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, tool, scenario, 100 + i, workdir) for i, (tool, scenario) in enumerate(runs)]
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results.append(result)
            name = f"{result['tool']}-{result['scenario']}"
            (args.out / f"{name}.stdout").write_text(result["stdout"])
            (args.out / f"{name}.stderr").write_text(result["stderr"])
    results.sort(key=lambda r: (r["tool"], r["scenario"]))
    manifest = {"compute_sanitizer": version, "runs": [{k: r[k] for k in ("tool", "scenario", "command", "exit", "seconds")}
                                                       for r in results]}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(version)
    print(f"{'tool':10} {'scenario':20} {'exit':>7} {'s':>6}  summary / parsed")
    for r in results:
        summaries = [line for line in r["stdout"].splitlines() if re.search(r"SUMMARY|Error:", line)]
        parsed = sanitizer.parse(r["tool"], r["stdout"])
        verdict = "clean" if parsed.clean else f"{len(parsed.findings)} findings"
        print(f"{r['tool']:10} {r['scenario']:20} {str(r['exit']):>7} {r['seconds']:6.1f}  {' | '.join(summaries)[-110:]}  [{verdict}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
