"""The gate levels' sibling totals come from ``tl.gather`` or from a round trip through each
program's scratch tile (``kernels/_gate_levels.py``, ``sibling_total_through``), per kernel
by config: chunk_gla's and chunk_rwkv6's ``intra`` / ``qkg``, chunk_kda's ``prepare`` /
``grad``, DPLR's ``intra`` / ``grad``. Both forms move the same fp32 values into the same
sums in the same order, so every output and gradient must be bitwise equal between them:
two chunks and a short tail, strong decay, an initial state; the levels' rows cross chunk
or program edges only if a scratch tile's offset is wrong."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels import chunk_dplr_delta_rule, chunk_gla, chunk_kda, chunk_rwkv6
from kernels._arch import is_interpreter
from kernels.delta_rule import chunk_kda as kda_module
from kernels.dplr import chunk as dplr_module
from kernels.gla import chunk as gla_module

pytestmark = pytest.mark.skipif(
    not (is_interpreter() or torch.cuda.is_available()), reason="needs a GPU or TRITON_INTERPRET=1"
)

OPS = ["chunk_gla", "chunk_rwkv6", "chunk_kda", "chunk_dplr_delta_rule"]


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
    if op in ("chunk_kda", "chunk_dplr_delta_rule"):
        x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
    if op == "chunk_kda":
        x["beta"] = torch.rand(B, T, H, generator=gen)
    if op == "chunk_dplr_delta_rule":
        x["a"] = -0.5 * x["k"]
        x["b"] = 0.5 * torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    if op == "chunk_rwkv6":
        x["u"] = torch.randn(H, K, generator=gen)
    return {name: t.to(_device()).requires_grad_(True) for name, t in x.items()}


def _run(op, x):
    if op == "chunk_gla":
        return chunk_gla(x["q"], x["k"], x["v"], x["g"], initial_state=x["h0"], output_final_state=True)
    if op == "chunk_rwkv6":
        return chunk_rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], initial_state=x["h0"], output_final_state=True)
    if op == "chunk_kda":
        return chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["h0"], output_final_state=True)
    return chunk_dplr_delta_rule(x["q"], x["k"], x["v"], x["a"], x["b"], x["g"], initial_state=x["h0"],
                                 output_final_state=True)


def _with_siblings(op, form, patch):
    """Every level kernel of the op takes the sibling totals by ``form``."""
    if op == "chunk_kda":
        base = kda_module.kda_configs
        patch.setattr(kda_module, "kda_configs",
                      lambda *a: dataclasses.replace(base(*a), prepare_siblings=form, grad_siblings=form))
    elif op == "chunk_dplr_delta_rule":
        base = dplr_module.choose_configs
        patch.setattr(dplr_module, "choose_configs",
                      lambda *a, **k: dataclasses.replace(base(*a, **k), intra_siblings=form, grad_siblings=form))
    else:
        base = gla_module._configs

        def configs(*a):
            cfg = base(*a)
            return {**cfg, "intra": {**cfg["intra"], "siblings": form}, "qkg": {**cfg["qkg"], "siblings": form}}
        patch.setattr(gla_module, "_configs", configs)


def _outputs_and_grads(op, form, patch):
    _with_siblings(op, form, patch)
    x = _inputs(op)
    o, ht = _run(op, x)
    gen = torch.Generator().manual_seed(2)
    cotangents = [torch.randn(t.shape, generator=gen).to(t.device) for t in (o, ht)]
    torch.autograd.backward([o, ht], cotangents)
    return {"o": o.detach(), "final_state": ht.detach(), **{f"d{n}": t.grad for n, t in x.items()}}


@pytest.mark.parametrize("op", OPS)
def test_scratch_sibling_totals_match_gather(op, monkeypatch):
    results = {}
    for form in ("gather", "scratch"):
        with monkeypatch.context() as patch:
            results[form] = _outputs_and_grads(op, form, patch)
    for name, b in results["gather"].items():
        a = results["scratch"][name]
        assert torch.isfinite(b).all(), f"{op} {name}: not finite by gather"
        assert torch.equal(a, b), f"{op} {name}: max difference {(a - b).abs().max().item():.3e} between the forms"
