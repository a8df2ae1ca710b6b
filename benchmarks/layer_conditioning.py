"""How ill-conditioned the layer's per-head gate parameters' gradients are (CPU, float64).

    python benchmarks/layer_conditioning.py

``dA_log[h] = sum_t dL/dg[t, h] * g[t, h]``: a sum over every token, with terms of both
signs. For the GatedDeltaNet spec's varlen packings (the conformance check's own sample and
seed) this prints, per head, ``kappa_1 = sum|terms| / |sum|`` and ``kappa_2 = ||terms||_2 /
|sum|``. An error ``delta`` relative to each term that is the same across tokens moves the
sum by up to ``kappa_1 * delta`` relative; independent errors by about ``kappa_2 * delta``.
docs/tolerances.md ("Layers") quotes the numbers.
"""

import torch

import reference.layers as reference_layers
from pytest_fla import checks
from pytest_fla.packings import packings
from pytest_fla.specs import layers as layer_specs


def conditioning(packing_name: str, dtype: str = "bf16"):
    spec = next(s for s in layer_specs.SPECS if s.name == "gated_delta_net")
    packing = next(p for p in packings(64) if p.name == packing_name)
    seed = checks.seed_for("varlen", spec.name, dtype, packing.name)
    sample = spec.sample(spec.cases[0], dtype, "cpu", seed, lengths=packing.lengths)
    captured = {}
    rule = reference_layers.gated_delta_rule

    def keep_gate(q, k, v, g, beta, **kwargs):  # the reference's own g, its gradient kept
        g.retain_grad()
        captured["g"] = g
        return rule(q, k, v, g, beta, **kwargs)

    reference_layers.gated_delta_rule = keep_gate
    try:
        checks.run_with_grads(spec.reference_for(dtype), sample, checks.differentiable(spec, sample), seed=seed,
                              upcast=True)
    finally:
        reference_layers.gated_delta_rule = rule
    g = captured["g"]
    terms = (g.grad * g).reshape(-1, g.shape[-1])
    total = terms.sum(0)
    return terms.shape[0], total, terms.abs().sum(0) / total.abs(), terms.norm(dim=0) / total.abs()


if __name__ == "__main__":
    for name in ("chunk_edges", "equal"):
        tokens, total, kappa_1, kappa_2 = conditioning(name)
        print(f"{name}: {tokens} tokens; dA_log {[round(x, 3) for x in total.tolist()]}; "
              f"kappa_1 {[round(x, 2) for x in kappa_1.tolist()]}; kappa_2 {[round(x, 2) for x in kappa_2.tolist()]}")
