# source: user report: "the matmul kernel works on A100 and H100 but fails to launch on an A10 (OutOfResources: shared memory)"
# seen-on: sm86
# expect: pass
# expect-sm86: raises CompileCheckFailed: over sm86's limit of 101376
# op: arch_tuned_matmul
# needs: compiler
"""Its stage count for sm86 was copied from sm80's table entry, so it asks for 128 KiB of
shared memory on an arch that has 99 KiB. Compiling for the session's arch shows it
without the card: the check fails for sm86 alone (a test kernel stands in for the user's)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugin"))
import faulty_kernels  # noqa: E402

from pytest_fla.checks.capture import assert_compiles, capture_launches  # noqa: E402
from pytest_fla.repro_helpers import target_arch  # noqa: E402

arch = target_arch()
with capture_launches(arch) as recorder:
    a = torch.randn(512, 512, dtype=torch.float16)
    faulty_kernels.arch_tuned_matmul(a, a)
print(assert_compiles(recorder.launches, arch).summary())
