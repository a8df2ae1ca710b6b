"""Whether a change alters the machine code of an op's launches: compile every launch of the
ops' first state case (fp32 state, forward and backward) offline for one arch and print a hash
of each launch's SASS, instruction text only (addresses and line info left out). Run it in two
checkouts and diff the outputs: equal hashes mean the change cannot move that code's speed.

    python benchmarks/sass_compare.py --ops chunk_gla,chunk_rwkv7 [--arch 90] > head.txt
    (cd ../base && python benchmarks/sass_compare.py --ops chunk_gla,chunk_rwkv7) > base.txt; diff base.txt head.txt

Runs on a machine without a GPU (Triton compiles offline; cuobjdump ships with Triton).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sass_hash(cubin: bytes) -> str:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    body = [re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).split(";")[0].strip() for line in sass.splitlines()
            if "/*" in line and ";" in line]
    return hashlib.sha1("\n".join(body).encode()).hexdigest()[:12]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", required=True)
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args()
    import torch

    from pytest_fla.checks.capture import capture_launches, compile_launch
    from specs import all_specs

    wanted = args.ops.split(",")
    for spec in (s for s in all_specs() if s.name in wanted):
        case = next((c for c in spec.cases if c.options.get("initial_state")), spec.cases[0])
        with capture_launches(args.arch) as recorder:
            sample = spec.sample(case, "bf16", "cpu", 0)
            if isinstance(sample.kwargs.get("initial_state"), torch.Tensor):
                sample.kwargs["initial_state"] = sample.kwargs["initial_state"].float()
            for name in spec.grads:
                value = sample.kwargs.get(name)
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    value.requires_grad_(True)
            out = spec.call(sample)
            outs = out if isinstance(out, tuple) else (out,)
            sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad).backward()
        for launch in recorder.launches:
            print(spec.name, case.name, launch.kernel.fn.__name__, sass_hash(compile_launch(launch, args.arch).asm["cubin"]))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "0")
    sys.exit(main())
