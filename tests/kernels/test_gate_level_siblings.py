"""The gate levels' sibling totals come from ``tl.gather`` or from a round trip through each
program's scratch tile (``kernels/_gate_levels.py``, ``sibling_total_through``; chunk_gla's,
chunk_rwkv6's and chunk_kda's forward intra kernels take the scratch form). Both move the
same fp32 values into the same sums in the same order, so every output must be bitwise
equal between them: two chunks and a short tail, strong decay, an initial state; the
levels' rows cross chunk edges only if the tiles' offsets are wrong."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels import chunk_gla, chunk_kda, chunk_rwkv6
from kernels._arch import is_interpreter
from kernels.delta_rule import chunk_kda as kda_module
from kernels.gla import chunk as gla_module

pytestmark = pytest.mark.skipif(
    not (is_interpreter() or torch.cuda.is_available()), reason="needs a GPU or TRITON_INTERPRET=1"
)


def _device():
    return torch.device("cuda") if (torch.cuda.is_available() and not is_interpreter()) else torch.device("cpu")


def _inputs(op):
    gen = torch.Generator().manual_seed(1)
    B, T, H, K, V = 2, 150, 2, 32, 32
    x = {name: torch.randn(B, T, H, K, generator=gen) for name in ("q", "k")}
    x["v"] = torch.randn(B, T, H, V, generator=gen)
    # strong decay: in-chunk gate sums reach the thousands, where a cancelling form would show
    x["g"] = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen)) / 0.05
    x["h0"] = torch.randn(B, H, K, V, generator=gen)
    if op == "chunk_kda":
        x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
        x["beta"] = torch.rand(B, T, H, generator=gen)
    if op == "chunk_rwkv6":
        x["u"] = torch.randn(H, K, generator=gen)
    return {name: t.to(_device()) for name, t in x.items()}


def _run(op, x):
    if op == "chunk_gla":
        return chunk_gla(x["q"], x["k"], x["v"], x["g"], initial_state=x["h0"], output_final_state=True)
    if op == "chunk_rwkv6":
        return chunk_rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], initial_state=x["h0"], output_final_state=True)
    return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"], output_final_state=True)


def _with_siblings(op, form, patch):
    if op == "chunk_kda":
        base = kda_module.kda_configs
        patch.setattr(kda_module, "kda_configs",
                      lambda *a: dataclasses.replace(base(*a), prepare_siblings=form))
    else:
        base = gla_module._configs
        patch.setattr(gla_module, "_configs",
                      lambda *a: {**base(*a), "intra": {**base(*a)["intra"], "siblings": form}})


@pytest.mark.parametrize("op", ["chunk_gla", "chunk_rwkv6", "chunk_kda"])
def test_scratch_sibling_totals_match_gather(op, monkeypatch):
    x = _inputs(op)
    outputs = {}
    for form in ("gather", "scratch"):
        with monkeypatch.context() as patch:
            _with_siblings(op, form, patch)
            outputs[form] = _run(op, x)
    for name, a, b in zip(("o", "final_state"), outputs["scratch"], outputs["gather"]):
        assert torch.isfinite(b).all(), f"{op} {name}: not finite by gather"
        assert torch.equal(a, b), f"{op} {name}: max difference {(a - b).abs().max().item():.3e} between the forms"
