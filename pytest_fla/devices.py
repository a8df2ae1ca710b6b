"""Where the numeric checks run, and which dtypes can be checked there.

On a GPU the checks run on the current CUDA device; on a machine without one (or with
``TRITON_INTERPRET=1``) they run on the CPU under Triton's interpreter, at the cases'
small sizes. Some dtypes cannot be checked in one of those places; ``dtype_skip_reason``
says which and why (the CI policy).
"""

from __future__ import annotations

import os

# The first Triton whose interpreter computes bf16 tl.dot right.
INTERPRETER_BF16_FROM = (3, 8)


def is_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def numeric_device():
    """The device the numeric checks run on: the GPU, or the CPU under the interpreter."""
    import torch

    if not is_interpreter() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def triton_version() -> tuple[int, int]:
    import triton

    major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    return major, minor


def dtype_skip_reason(dtype: str, device) -> str | None:
    """Why ``dtype`` is not checked on ``device`` (None when it is):

    * bf16 on the CPU under a Triton older than 3.8, whose interpreter computes bf16
      ``tl.dot`` wrongly (bf16 is checked on the GPU, and on the CPU from Triton 3.8);
    * fp16 on the GPU: the CPU job checks it, and the GPU run spends its time on bf16
      and fp32.
    """
    import torch

    kind = torch.device(device).type
    if kind == "cpu" and dtype == "bf16" and triton_version() < INTERPRETER_BF16_FROM:
        import triton

        return (f"Triton {triton.__version__}'s interpreter computes bf16 tl.dot wrongly; "
                "bf16 is checked on the GPU")
    if kind == "cuda" and dtype == "fp16":
        return "fp16 is checked in the CPU job (interpreter); the GPU run spends its time on bf16 and fp32"
    return None
