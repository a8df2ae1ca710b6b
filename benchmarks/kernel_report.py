"""What the compiler makes of an op's kernels, offline (no GPU needed): per launch, the
kernel, its config, grid, shared memory, and from ``ptxas -v`` its registers and spills.

    FLA_TARGET_ARCH=sm90 python benchmarks/kernel_report.py chunk_gla [--bwd] [--size B,T,H,K,V] [--variant NAME]
                                                               [--dump DIR]

The op runs on CPU tensors under launch capture (``pytest_fla.checks.capture``), at the benchmark
size by default, with the target arch's configs; every distinct launch is compiled for that
arch. Spilled registers (local memory) and launches per call are what this is for; with
``--dump`` each kernel's TTGIR and PTX go to DIR, and the report counts its layout
conversions and shared-memory instructions (where a kernel's shared-memory traffic comes
from: Nsight Compute's excess wavefronts, benchmarks/results/README.md). A launch whose
butterfly sums let the lanes' copies disagree (a multiply-add on a shuffled value: each
lane rounds a different product) says how many; where such copies are stored through shared
memory, racecheck reports a write-after-write (``kernels/_arch.py``, ``RECURRENT_OPTIONS``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def ptxas_usage(ptx: str, arch: int) -> str:
    """``ptxas -v``'s register and spill lines for ``ptx``."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(arch).path if hasattr(get_ptxas(arch), "path") else get_ptxas(arch)
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        done = subprocess.run([ptxas, "-v", f"--gpu-name={gpu}", src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True)
    text = done.stdout + done.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return (f"{regs.group(1) if regs else '?'} regs, "
            + (f"spills {spill.group(1)} B stored / {spill.group(2)} B loaded" if spill else "spills ?"))


def lane_divergent_sums(ptx: str) -> int:
    """Multiply-adds whose addend is a butterfly shuffle's result: the first stage of a sum
    over lanes contracted with its products, so the lanes' copies of the sum differ."""
    shuffled = set(re.findall(r"shfl\.sync\.bfly\.b32\s+(%r\d+)", ptx))
    return sum(m.group(1) in shuffled for m in re.finditer(r"fma\.rn\.f32\s+%r\d+,\s*%r\d+,\s*%r\d+,\s*(%r\d+);", ptx))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op")
    ap.add_argument("--bwd", action="store_true", help="the backward's launches (default: the forward's)")
    ap.add_argument("--size", default="4,4096,16,128,128", help="B,T,H,K,V (default: the benchmark size)")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--variant", default=None, help="a config_sweep.py variant of the op, e.g. 'intra 16 warps'")
    ap.add_argument("--dump", default=None, metavar="DIR", help="write each kernel's TTGIR and PTX there")
    args = ap.parse_args()
    if args.variant:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import config_sweep

        config_sweep.apply(args.op, args.variant)

    from kernels._arch import parse_arch, target_arch
    from pytest_fla.checks.capture import compile_launch
    from pytest_fla.checks.compile_per_arch import capture_op
    from pytest_fla.ops.spec import Case
    from specs import all_specs

    arch = parse_arch(os.environ.get("FLA_TARGET_ARCH") or target_arch())
    spec = {s.name: s for s in all_specs()}[args.op]
    B, T, H, K, V = (int(x) for x in args.size.split(","))
    base = spec.compile_cases[0] if spec.compile_cases else spec.cases[0]
    dims = {**base.dims, "B": B, "T": T, "H": H, "K": K, "V": V}
    if "HV" in dims:  # grouped value heads: the bench runs one value head per key head
        dims["HV"] = H
    case = Case("report", dims, options=base.options)
    spec = spec.__class__(**{**spec.__dict__, "compile_cases": (case,)})
    launches = capture_op(spec, arch, "bwd" if args.bwd else "fwd", (args.dtype,))
    print(f"{args.op} {'bwd' if args.bwd else 'fwd'} sm{arch} {args.dtype} B,T,H,K,V={args.size}: {len(launches)} launches")
    seen = set()
    for launch in launches:
        compiled = compile_launch(launch, arch)
        if isinstance(compiled, Exception):
            print(f"  {launch.name}: does not compile: {compiled}")
            continue
        usage = ptxas_usage(compiled.asm["ptx"], arch) if launch.key() not in seen else "(as above)"
        seen.add(launch.key())
        divergent = lane_divergent_sums(compiled.asm["ptx"])
        usage += f", {divergent} lane-divergent sums" if divergent else ""
        print(f"  {launch.name} grid={launch.grid} shared={compiled.metadata.shared} {usage}\n    {launch.config()}")
        if args.dump:
            print("    " + dump(compiled, launch.name, args.dump))


def dump(compiled, name: str, directory: str) -> str:
    """Write the kernel's TTGIR and PTX to ``directory``; a line of what they hold."""
    os.makedirs(directory, exist_ok=True)
    ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    for suffix, text in (("ttgir", ttgir), ("ptx", ptx)):
        with open(os.path.join(directory, f"{name}.{suffix}"), "w") as f:
            f.write(text)
    counts = {"convert_layout": ttgir.count("ttg.convert_layout"), "local_alloc": ttgir.count("ttg.local_alloc"),
              "gather": ttgir.count("tt.gather"), "st.shared": ptx.count("st.shared"),
              "ld.shared": ptx.count("ld.shared"), "shfl": ptx.count("shfl.sync"), "bar.sync": ptx.count("bar.sync")}
    return "TTGIR/PTX: " + ", ".join(f"{k} {v}" for k, v in counts.items())


if __name__ == "__main__":
    main()
