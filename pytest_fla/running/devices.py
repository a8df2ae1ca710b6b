"""Where the numeric checks run, and which dtypes can be checked there.

On a GPU the checks run on the current CUDA device; on a machine without one (or with
``TRITON_INTERPRET=1``) they run on the CPU under Triton's interpreter, at the cases'
small sizes. Some dtypes cannot be checked in one of those places; ``dtype_skip_reason``
says which and why (the CI policy). The float64 reference runs beside the kernel, except
where ``FLA_REFERENCE_DEVICE`` sends it elsewhere (``reference_device``).
"""

from __future__ import annotations

import os

from .. import environment


def is_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def numeric_device():
    """The device the numeric checks run on: the GPU, or the CPU under the interpreter."""
    import torch

    if not is_interpreter() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def dtype_skip_reason(dtype: str, device) -> str | None:
    """Why ``dtype`` is not checked on ``device`` (None when it is):

    * on the CPU, what Triton's interpreter cannot check (``pytest_fla.targets.toolchain``: bf16
      ``tl.dot``, measured wrong on every Triton from 3.6 to 3.9);
    * fp16 on the GPU: the CPU job checks it, and the GPU run spends its time on bf16
      and fp32.
    """
    import torch

    kind = torch.device(device).type
    if kind == "cpu":
        from ..targets.toolchain import interpreter_skip_reason

        return interpreter_skip_reason(dtype)
    if kind == "cuda" and dtype == "fp16":
        return "fp16 is checked in the CPU job (interpreter); the GPU run spends its time on bf16 and fp32"
    return None


def reference_device() -> str | None:
    """The device the reference runs on (its inputs moved there, its results moved back),
    or None: beside the kernel."""
    # ``cpu`` under the sanitizer (``sanitizer.environment``). The tool instruments every CUDA
    # launch, and a reference recurrence is thousands of small ones: at the tool's small shapes
    # it was 586 of the tool's 1035 s in the H100's memcheck run (10 s plainly), checking
    # nothing the tool is there for.
    return os.environ.get(environment.REFERENCE_DEVICE) or None


def reference_call(call, kwargs: dict, *rest):
    """``call(kwargs, *rest)``, the float64 reference's work, timed as its part of the test
    (``time_split``) and run on ``reference_device``: every tensor in the arguments moved
    there, every tensor in the result moved back to the device of ``kwargs``' first one."""
    from ..report import time_split

    with time_split.part(time_split.REFERENCE):
        elsewhere = reference_device()
        if elsewhere is None:
            return call(kwargs, *rest)
        home = home_device(kwargs.values())
        return moved(call(moved(kwargs, elsewhere), *moved(rest, elsewhere)), home)


def moved(value, device):
    """``value`` with every tensor in it (through tuples, lists and dicts) on ``device``."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: moved(v, device) for k, v in value.items()}
    return value


def home_device(values):
    """The device of the first tensor among ``values`` (a sample's kwargs), or None."""
    import torch

    return next((v.device for v in values if isinstance(v, torch.Tensor)), None)
