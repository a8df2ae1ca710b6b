"""Model layers built from this repo's kernels (docs/ops.md, "Layers"): thin compositions,
each a functional form whose parameters are arguments plus an ``nn.Module`` holding them."""

from .gated_deltanet import GatedDeltaNet, gated_delta_net

__all__ = ["GatedDeltaNet", "gated_delta_net"]
