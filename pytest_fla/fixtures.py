"""Fixtures for the conformance checks: input families that find kernel bugs.

Each fixture is a parametrized family whose ids say what the case is, so a failing
test names the packing, shape or device that broke it. torch is imported only inside
fixtures: importing the plugin must stay light.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from . import targets
from .checks.poison import poisoned

GRID_LIMIT = 65535  # CUDA's cap on grid axes 1 and 2


INDEX_DTYPES = ("int32", "int64")
DEFAULT_CHUNK_SIZE = 64


@pytest.fixture
def fla_chunk_size() -> int:
    """The chunk size the ``cu_seqlens`` packings are built around (override to change it)."""
    return DEFAULT_CHUNK_SIZE


def parametrize_cu_seqlens(metafunc) -> None:
    """Parametrize ``cu_seqlens`` over packing x index dtype (names are read at collection,
    so that importing the plugin does not import torch)."""
    from .ops.packings import packings

    names = [p.name for p in packings(DEFAULT_CHUNK_SIZE)]
    params = [(name, dtype) for name in names for dtype in INDEX_DTYPES]
    metafunc.parametrize("cu_seqlens", params, indirect=True, ids=[f"{n}-{d}" for n, d in params])


@pytest.fixture
def cu_seqlens(request, fla_chunk_size):
    """A variable-length packing (``pytest_fla.ops.packings.Packing``: ``.name``, ``.lengths``,
    ``.index_dtype``), for offsets built with e.g. ``spec.sample(..., lengths=p.lengths)``.

    Parametrized over every packing (one sequence, equal lengths, lengths 1 and
    chunk-1 / chunk / chunk+1, zero-length sequences, many short) times int32 and int64
    offsets; ``fla_chunk_size`` sets the chunk the lengths sit around.
    """
    import dataclasses

    import torch

    from .ops.packings import packings

    name, dtype = request.param
    packing = next(p for p in packings(fla_chunk_size) if p.name == name)
    return dataclasses.replace(packing, index_dtype=getattr(torch, dtype))


@dataclass(frozen=True)
class HugeShape:
    """Input sizes for a huge-grid or 64-bit-offset case (``lengths`` set for varlen)."""

    name: str
    B: int
    T: int
    H: int
    K: int
    V: int
    lengths: tuple | None = None

    def numel(self) -> int:
        return self.B * self.T * self.H * max(self.K, self.V)


# B=10923, H=6, T=32 is the reported case: B*H = 65538 launched a grid CUDA refused.
HUGE_SHAPES = {
    "batch_heads": HugeShape("batch_heads", B=10923, T=32, H=6, K=32, V=32),
    "seqs_heads": HugeShape("seqs_heads", B=1, T=2 * 16385, H=4, K=32, V=32, lengths=(2,) * 16385),
    "over_2_31_elements": HugeShape("over_2_31_elements", B=1, T=2**20 + 64, H=16, K=128, V=128),
}
# What the largest case needs on the device: forward and backward of a few such tensors.
LARGE_CASE_BYTES = 64 * 2**30


def _current_mode(config) -> str | None:
    target = targets.run_target(config)
    return target.mode if target else None


@pytest.fixture(
    params=[
        pytest.param(name, marks=[pytest.mark.large_memory] if shape.numel() > 2**31 else [])
        for name, shape in HUGE_SHAPES.items()
    ]
)
def huge_batch(request) -> HugeShape:
    """Shapes past CUDA's grid limits: B*H > 65535, N*H > 65535 (varlen), and, on a GPU
    with the memory for it, tensors of more than 2**31 elements (marked ``large_memory``).

    Under the interpreter these skip: there is no grid limit to exceed there, and tens
    of thousands of programs would run one at a time.
    """
    shape = HUGE_SHAPES[request.param]
    if _current_mode(request.config) == targets.INTERPRETER:
        pytest.skip("huge grids test CUDA's launch limits; the CPU interpreter has none")
    if shape.numel() > 2**31:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("tensors over 2**31 elements need a GPU")
        free, _ = torch.cuda.mem_get_info()
        if free < LARGE_CASE_BYTES:
            pytest.skip(f"needs {LARGE_CASE_BYTES >> 30} GiB free on the GPU, has {free >> 30} GiB")
    return shape


@dataclass(frozen=True)
class RotaryDims:
    """A head dim and rotary dim pair; ``error`` is the ValueError pattern a misuse must raise."""

    name: str
    head_dim: int
    rotary_dim: int
    num_heads: int = 4
    error: str | None = None


ROTARY_DIMS = {
    "full": RotaryDims("full", 64, 64),
    "partial": RotaryDims("partial", 64, 32),
    "odd_head_dim": RotaryDims("odd_head_dim", 65, 32),
    "odd_rotary_dim": RotaryDims("odd_rotary_dim", 64, 33, error=r"33[\s\S]*64|64[\s\S]*33"),
    # The classic misuse: the model width (heads * head dim) passed as the rotary dim.
    "model_width": RotaryDims("model_width", 64, 4 * 64, error=r"256[\s\S]*64|64[\s\S]*256"),
}


@pytest.fixture(params=list(ROTARY_DIMS))
def rotary_dims(request) -> RotaryDims:
    """(head dim, rotary dim) pairs: full, partial, an odd head dim, an odd rotary dim and
    the model width passed as the rotary dim; the last two must raise a ValueError naming
    both numbers (``.error`` is its pattern)."""
    return ROTARY_DIMS[request.param]


@dataclass(frozen=True)
class DeviceMismatch:
    """Moves one tensor argument at a time onto a device the others are not on."""

    kind: str  # "other_kind" or "other_gpu"

    def wrong_device(self, home):
        import torch

        if self.kind == "other_gpu":
            return torch.device("cuda", (home.index or 0) + 1 if home.type == "cuda" else 0)
        # A CUDA tensor's odd one out is on the CPU; under the interpreter, where every
        # tensor is on the CPU, it is a meta tensor.
        return torch.device("cpu") if home.type == "cuda" else torch.device("meta")

    def variants(self, kwargs: dict):
        """Yield ``(name, kwargs with that tensor moved, the device it moved to)`` per tensor argument."""
        import torch

        tensors = [n for n, v in kwargs.items() if isinstance(v, torch.Tensor) and not n.endswith("_cpu")]
        if not tensors:
            raise ValueError("device_mismatch: the op's arguments hold no tensor")
        home = kwargs[tensors[0]].device
        wrong = self.wrong_device(home)
        for name in tensors:
            moved = dict(kwargs)
            moved[name] = kwargs[name].detach().to(wrong)
            yield name, moved, wrong


@pytest.fixture(params=["other_kind", "other_gpu"])
def device_mismatch(request) -> DeviceMismatch:
    """Each tensor argument in turn on the wrong device: ``.variants(kwargs)`` yields
    ``(name, kwargs, device)``. ``other_kind`` puts it on the CPU (a meta tensor under the
    interpreter); ``other_gpu`` on a second GPU, and skips without one."""
    if request.param == "other_gpu":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            pytest.skip("needs two visible GPUs")
    return DeviceMismatch(request.param)


@pytest.fixture(autouse=True)
def fla_poison_allocations(request):
    """Fill every buffer the library under test allocates with NaN (-1 for integers)
    during the test, so an output element a kernel forgot to write cannot pass for a
    plausible value. What is poisoned is the ini option ``fla_poison``
    (``pytest_fla.checks.poison``: ``torch``'s allocators by default, or a flag the library's
    allocation helper reads, as this repo's ``kernels._utils:POISON_ALLOCATIONS``).

    Active for tests of an op (``fla_op`` marker); elsewhere only for a flag whose module
    is already imported. It never imports torch for a test that does not use it."""
    with poisoned(op_test=request.node.get_closest_marker("fla_op") is not None):
        yield


@pytest.fixture
def fla_device(request):
    """The device the numeric checks run on (``pytest_fla.running.devices.numeric_device``): the
    GPU, held shared with the other workers' checks on it (the few that need most of its
    memory hold it alone and wait for these), or the CPU under the interpreter. Skips
    a ``dtype`` parameter that cannot be checked there, saying why."""
    from .running.devices import dtype_skip_reason, numeric_device

    device = numeric_device()
    dtype = request.node.callspec.params.get("dtype") if hasattr(request.node, "callspec") else None
    reason = dtype and dtype_skip_reason(dtype, device)
    if reason:
        pytest.skip(reason)
    if device.type != "cuda":
        yield device
        return
    from .running import gpu_share

    with gpu_share.for_device(device).shared():
        yield device
