"""Kernel variants timed side by side on one GPU: the configs (block sizes, warps, stages,
structure switches) of the slow kernels, and the kernels as they were (a baseline tree).

    python benchmarks/config_sweep.py [--ops chunk_gla,causal_conv1d] [--jobs 16] [--phase compile|time|all]
                                      [--baseline .carry/baseline] [--profile] [--graphs] [--out FILE]

Each variant overrides one kernel's config and leaves the others at the op's defaults;
``default`` is what the op picks today; ``baseline`` is the same op imported from another
tree (``--baseline DIR``: a ``kernels/`` package there, e.g. ``git archive main kernels |
tar -x -C DIR``), so old and new kernels are timed in the same run. Sizes and inputs are
the fair bench's (``bench.py``): B=4 T=4096 H=16 K=V=128 bf16, conv B=8 T=4096 D=4096 W=4.

Variants compile first, in parallel processes (one per op and variant, into the shared
Triton cache); then each op's variants are timed one after another in one fresh process
per op (the baseline in its own) on the idle GPU, forward and forward+backward, as the
median of ``--rounds`` rounds that each time every variant once; ``--graphs`` times each
call's CUDA-graph replay instead (the kernels alone, for host-bound lines). ``--profile`` adds, for
the default and the baseline, each kernel's share of a call (torch.profiler). A variant
that fails to compile or run is reported with its error; after a CUDA fault (an illegal
address: Triton 3.6 makes some of the gate-level kernels fault at 4 warps on sm90) the op's
other variants are timed again in a fresh process. The table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _gla(**over):
    """Override chunk_gla's per-kernel configs (``output``: a whole config, it is None by default)."""
    def merged(name, cfg):
        if name not in over:
            return cfg
        return {**cfg, **over[name]} if cfg else over[name]
    return ("kernels.gla.chunk", "_configs", lambda base: lambda *a: {n: merged(n, c) for n, c in base(*a).items()})


def _replace_configs(module: str, attr: str, **over):
    """Override fields of a dataclass of configs that ``module.attr(...)`` returns."""
    import dataclasses
    return (module, attr, lambda base: lambda *a, **k: dataclasses.replace(base(*a, **k), **over))


def _gdr(**over):
    return _replace_configs("kernels.delta_rule.chunk", "choose_configs", **over)


def _kda(**over):
    """chunk_kda's configs (``kda_configs``: the delta rule's other ops keep theirs)."""
    return _replace_configs("kernels.delta_rule.chunk_kda", "kda_configs", **over)


def _dplr(**over):
    """The DPLR configs (chunk_dplr_delta_rule and chunk_rwkv7)."""
    return _replace_configs("kernels.dplr.chunk", "choose_configs", **over)


def _recurrent(fwd=None, bwd=None, dq=None, split_v=False, rows=None):
    """Override the fused-recurrent configs: (BV, num_warps) forward, backward (both of its
    passes, split by V) and/or the backward's first pass alone (``dq``); ``split_v``: the
    second pass split by V blocks even under a per-channel gate; ``rows``: (key rows,
    num_warps) of the second pass split by K."""
    def wrap(base):
        def configs(K, V, backward, bonus=False, channel_gate=False):
            by_v = split_v or bwd is not None
            cfg = base(K, V, backward, bonus, channel_gate=channel_gate and not by_v)
            pick = bwd if backward else fwd
            if pick is not None:
                cfg = {**cfg, "BV": pick[0], "num_warps": pick[1]}
                if backward:
                    cfg.update(dq_BV=pick[0], dq_warps=pick[1])
            if backward and dq is not None:
                cfg = {**cfg, "dq_BV": dq[0], "dq_warps": dq[1]}
            if backward and rows is not None and cfg.get("split") == "K":
                cfg = {**cfg, "rows_BK": rows[0], "num_warps": rows[1]}
            return cfg
        return configs
    return ("kernels.gated_recurrent.fused_recurrent", "_configs", wrap)


def _conv(fwd=None, bwd=None):
    """Override the conv configs: (ROWS, AHEAD, channels a thread, num_warps)."""
    def as_config(rows, ahead, per_thread, warps):
        return lambda D, *rest: (rows, ahead, min(per_thread * 32 * warps, 1 << (D - 1).bit_length()), warps)
    patches = []
    if fwd:
        patches.append(("kernels.conv", "_fwd_config", lambda base: as_config(*fwd)))
    if bwd:
        patches.append(("kernels.conv", "_bwd_config", lambda base: as_config(*bwd)))
    return patches


# the prepare kernel's value block and stages, the output kernel's stages (every delta-rule
# size); the default took the last since (bf16 on the 228 KB parts), "(before)" is the one before it
_GDR_PREPARE_OUTPUT = {
    "prepare BV 64, 2 stages, output 2 stages (before)": _gdr(prepare_BV=64, prepare_stages=2, output_stages=2),
    "prepare 3 stages": _gdr(prepare_stages=3),
    "prepare BV 128, 3 stages": _gdr(prepare_BV=128, prepare_stages=3),
    "output 3 stages": _gdr(output_stages=3),
    "prepare BV 128, 3 stages, output 3 stages": _gdr(prepare_BV=128, prepare_stages=3, output_stages=3),
}


# op -> {variant: patch or list of patches}; a patch is (module, attribute, base -> replacement)
VARIANTS = {
    "chunk_gla": {
        "default": [],
        "output split, BK 128 BV 64, 4 warps 2 stages": _gla(output=dict(BK=128, BV=64, num_warps=4, num_stages=2)),
        "output split, BK 64 BV 64, 4 warps 3 stages": _gla(output=dict(BK=64, BV=64, num_warps=4, num_stages=3)),
        "output split, BK 128 BV 128, 8 warps 2 stages": _gla(output=dict(BK=128, BV=128, num_warps=8, num_stages=2)),
        "intra 16 warps": _gla(intra={"num_warps": 16}),
        "intra 4 warps": _gla(intra={"num_warps": 4}),
        "intra BK 64": _gla(intra={"BK": 64}),
        "state 4 warps": _gla(state={"num_warps": 4}),
        "state BV 32, 4 warps": _gla(state={"BV": 32, "num_warps": 4}),
        "state 2 stages": _gla(state={"num_stages": 2}),
        "qkg BV 32": _gla(qkg={"BV": 32}),
        "qkg BK 32": _gla(qkg={"BK": 32}),
        # a register cap (kernels._arch.launch_options): 128 a thread fits two 8-warp blocks
        # on an SM, at the cost of spilling (ptxas -v: kernel_report.py)
        "intra 168 regs": _gla(intra={"maxnreg": 168}),
        "intra BK 64, 128 regs": _gla(intra={"BK": 64, "maxnreg": 128}),
        "intra BK 32, 128 regs": _gla(intra={"BK": 32, "maxnreg": 128}),
        "qkg 128 regs": _gla(qkg={"maxnreg": 128}),
        # where the intra kernel's time goes (timings only: the results are wrong): its loads,
        # stores and final exponentials with no level (0), half the levels (3), and every
        # level without its sibling totals (no tl.gather: the sums never merge)
        "cost: 0 levels": ("kernels.gla.chunk", "LEVELS", lambda base: 0),
        "cost: 3 levels": ("kernels.gla.chunk", "LEVELS", lambda base: 3),
        "intra BK 64, 8 warps": _gla(intra={"BK": 64, "num_warps": 8}),
        "intra siblings by gather": _gla(intra={"siblings": "gather"}),
        "intra siblings by scratch, 8 warps": _gla(intra={"siblings": "scratch", "num_warps": 8}),
        "intra siblings by scratch, BK 64, 8 warps": _gla(intra={"siblings": "scratch", "BK": 64, "num_warps": 8}),
        "qkg siblings by scratch": _gla(qkg={"siblings": "scratch"}),
        # the pair products at the peer's accuracy (tf32 operands): what they cost, and
        # which blocks pay it back
        "qkg tf32 pairs": _gla(qkg={"pairs": "tf32"}),
        "qkg tf32 pairs, siblings by scratch": _gla(qkg={"pairs": "tf32", "siblings": "scratch"}),
        "qkg tf32 pairs, BV 32": _gla(qkg={"pairs": "tf32", "BV": 32}),
        "qkg tf32 pairs, BK 32": _gla(qkg={"pairs": "tf32", "BK": 32}),
        "qkg tf32 pairs, 4 warps": _gla(qkg={"pairs": "tf32", "num_warps": 4}),
        # the default's fp16 operands (scaled a tile) against the bf16 ones before them
        "qkg bf16 pairs (before)": _gla(qkg={"pairs": "bf16"}),
        "qkg fp16 pairs, siblings by scratch": _gla(qkg={"pairs": "fp16", "siblings": "scratch"}),
    },
    "fused_recurrent_gla": {
        "default": [],
        "fwd BV 16, 1 warp": _recurrent(fwd=(16, 1)),
        "fwd BV 16, 2 warps": _recurrent(fwd=(16, 2)),
        "fwd BV 32, 2 warps": _recurrent(fwd=(32, 2)),
        "fwd BV 32, 4 warps": _recurrent(fwd=(32, 4)),
        "fwd BV 64, 8 warps": _recurrent(fwd=(64, 8)),
        "bwd split V, BV 16, 2 warps (before)": _recurrent(split_v=True),
        "bwd split K, 32 rows, 4 warps": _recurrent(rows=(32, 4)),
        "bwd BV 32, 8 warps": _recurrent(bwd=(32, 8)),
        "bwd BV 16, 2 warps": _recurrent(bwd=(16, 2)),
        "bwd BV 16, 4 warps": _recurrent(bwd=(16, 4)),
        "bwd BV 32, 4 warps": _recurrent(bwd=(32, 4)),
        "bwd BV 128, 8 warps": _recurrent(bwd=(128, 8)),
        "dq pass BV 64, 4 warps": _recurrent(dq=(64, 4)),
        "dq pass BV 32, 2 warps": _recurrent(dq=(32, 2)),
    },
    "causal_conv1d": {
        "default": [],
        "fwd 4 a thread, ahead 4 (before)": _conv(fwd=(64, 4, 4, 4)),
        "fwd 8 a thread": _conv(fwd=(64, 4, 8, 4)),
        "fwd ahead 2": _conv(fwd=(64, 2, 4, 4)),
        "bwd ahead 2": _conv(bwd=(128, 2, 4, 4)),
        "fwd ahead 8": _conv(fwd=(64, 8, 4, 4)),
        "fwd 8 a thread, ahead 8": _conv(fwd=(64, 8, 8, 4)),
        "fwd 128 rows, ahead 8": _conv(fwd=(128, 8, 4, 4)),
        "fwd 8 warps": _conv(fwd=(64, 4, 4, 8)),
        "fwd 2 a thread, ahead 8": _conv(fwd=(64, 8, 2, 4)),
        "fwd rows fastest (before)": ("kernels.conv", "FWD_CHANNELS_FASTEST", lambda base: False),
        "fwd 128 rows": _conv(fwd=(128, 4, 4, 4)),
        "fwd 32 rows": _conv(fwd=(32, 4, 4, 4)),
        "bwd 8 a thread": _conv(bwd=(128, 4, 8, 4)),
        "bwd ahead 8": _conv(bwd=(128, 8, 4, 4)),
        "bwd 256 rows, ahead 8": _conv(bwd=(256, 8, 4, 4)),
    },
    "chunk_gated_delta_rule": {
        "default": [],
        "state BV 32": _gdr(state_BV=32),
        "output BK 128": _gdr(output_BK=128),
        **_GDR_PREPARE_OUTPUT,
    },
    "chunk_delta_rule": {"default": [], **_GDR_PREPARE_OUTPUT},
    # K = 256, V = 512 (GatedDeltaNet's head dims): the [256, BV] state of the sequential
    # pass, 8 warps and one stage at BV 64, is 192 programs at B = 4, HV = 6 on 132
    # multiprocessors
    "chunk_gated_delta_rule_v512": {
        "default": [],
        "state BV 32": _gdr(state_BV=32),
        "state BV 32, 4 warps": _gdr(state_BV=32, state_warps=4),
        "state BV 32, 4 warps, 2 stages": _gdr(state_BV=32, state_warps=4, state_stages=2),
        "state BV 32, 2 stages": _gdr(state_BV=32, state_stages=2),
        "state BV 64, 2 stages": _gdr(state_stages=2),
        "state BV 64, 3 stages": _gdr(state_stages=3),
        "state BV 32, 4 warps, 3 stages": _gdr(state_BV=32, state_warps=4, state_stages=3),
        "state BV 64, 4 warps, 2 stages": _gdr(state_warps=4, state_stages=2),
        "output BV 64": _gdr(output_BV=64),
        "output BV 256": _gdr(output_BV=256, output_warps=8),
        "output BK 128": _gdr(output_BK=128),
        "prepare BV 128": _gdr(prepare_BV=128),
        "prepare 8 warps": _gdr(prepare_warps=8),
        "prepare BK 128": _gdr(prepare_BK=128),
        "prepare BK 128, BV 128": _gdr(prepare_BK=128, prepare_BV=128),
        "output 8 warps": _gdr(output_warps=8),
        "output BV 64, 3 stages": _gdr(output_BV=64, output_stages=3),
        "output BK 128, 8 warps": _gdr(output_BK=128, output_warps=8),
        "state 8 warps, 2 stages": _gdr(state_warps=8, state_stages=2),
        **_GDR_PREPARE_OUTPUT,
        "prepare BK 128, BV 128, 3 stages": _gdr(prepare_BK=128, prepare_BV=128, prepare_stages=3),
        "prepare BV 128, 4 stages": _gdr(prepare_BV=128, prepare_stages=4),
        "prepare BV 256, 3 stages": _gdr(prepare_BV=256, prepare_stages=3),
    },
}
VARIANTS["chunk_kda"] = {
    "default": [],
    "intra 8 warps (before)": _kda(prepare_warps=8),  # the one-product launch; the levels launch has its own
    "intra siblings by scratch": _kda(prepare_siblings="scratch"),
    "intra siblings by scratch, 16 warps": _kda(prepare_siblings="scratch", prepare_warps=16),
    "grad siblings by scratch": _kda(grad_siblings="scratch"),
    # the in-chunk pair products' operands: the default's fp16 for the score products only,
    # against fp16 for all four and the bf16 before (docs/tolerances.md)
    "grad fp16 pairs": _kda(pairs="fp16"),
    "grad bf16 pairs (before)": _kda(pairs="bf16"),
    "intra 16 warps": _kda(prepare_warps=16),
    "intra BK 32, 16 warps": _kda(prepare_BK=32, prepare_warps=16),
    "intra BK 32": _kda(prepare_BK=32),
    "prepare BV 128": _kda(prepare_BV=128),
    "output 3 stages": _kda(output_stages=3),
    "grad BK 64 (before)": _kda(grad_BK=64),
    "grad BK 32, 16 warps": _kda(grad_warps=16),
    "grad BK 32, 4 warps": _kda(grad_warps=4),
    "grad BV 32": _kda(grad_BV=32),
    "intra 168 regs": _kda(prepare_maxnreg=168),
    "intra 4 warps, 128 regs": _kda(prepare_maxnreg=128),
    "intra BK 32, 128 regs": _kda(prepare_BK=32, prepare_maxnreg=128),
    "grad 128 regs": _kda(grad_maxnreg=128),
    "grad 168 regs": _kda(grad_maxnreg=168),
}
VARIANTS["chunk_dplr_delta_rule"] = {
    "default": [],
    "intra 16 warps": _dplr(intra_warps=16),
    "intra siblings by scratch": _dplr(intra_siblings="scratch"),
    "grad siblings by scratch": _dplr(grad_siblings="scratch"),
    "intra 4 warps": _dplr(intra_warps=4),
    "intra BK 64, 16 warps": _dplr(intra_BK=64, intra_warps=16),
    "intra BV 32": _dplr(intra_BV=32),
    "grad 16 warps": _dplr(grad_warps=16),
    "grad 4 warps": _dplr(grad_warps=4),
    "grad BV 32": _dplr(grad_BV=32),
    "score 16 warps": _dplr(score_warps=16),
    "intra 128 regs": _dplr(intra_maxnreg=128),
    "intra 168 regs": _dplr(intra_maxnreg=168),
    "intra BK 16, 128 regs": _dplr(intra_BK=16, intra_maxnreg=128),
    "grad 128 regs": _dplr(grad_maxnreg=128),
    "grad 168 regs": _dplr(grad_maxnreg=168),
    "score 128 regs": _dplr(score_maxnreg=128),
}
VARIANTS["fused_recurrent_rwkv6"] = {
    "default": [],
    "bwd split V, BV 32, 4 warps (before)": _recurrent(split_v=True),
    "bwd split K, 16 rows, 2 warps": _recurrent(rows=(16, 2)),
    "bwd split K, 64 rows, 8 warps": _recurrent(rows=(64, 8)),
    "bwd BV 16, 2 warps": _recurrent(bwd=(16, 2)),
    "bwd BV 32, 8 warps": _recurrent(bwd=(32, 8)),
    "bwd BV 64, 4 warps": _recurrent(bwd=(64, 4)),
    "fwd BV 64, 4 warps (before)": _recurrent(fwd=(64, 4)),
    "fwd BV 16, 1 warp": _recurrent(fwd=(16, 1)),
    "bwd BV 32, 2 warps": _recurrent(bwd=(32, 2)),
    "bwd BV 16, 1 warp": _recurrent(bwd=(16, 1)),
    # the backward's first pass (dq, the forward kernel) on its own V split
    "dq pass BV 16, 2 warps": _recurrent(dq=(16, 2)),
    "dq pass BV 16, 1 warp": _recurrent(dq=(16, 1)),
    "dq pass BV 32, 2 warps": _recurrent(dq=(32, 2)),
    "dq pass BV 64, 4 warps": _recurrent(dq=(64, 4)),
}
VARIANTS["fused_recurrent_simple_gla"] = dict(VARIANTS["fused_recurrent_gla"])
def _norm_tile(chooser: str, elements: int, warps: int | None = None):
    """One of the norms' row-tile choosers (``_forward_tile``, ``_backward_tile``) replaced:
    about ``elements`` values a program on ``warps`` warps (the backward's tile without a
    parameter gradient, l2norm's, kept)."""
    def wrap(base):
        import kernels.norm as norm

        def tile(D, *flags):
            if chooser == "_backward_tile" and not flags[0]:
                return base(D, *flags)
            rows, block_d, default_warps = norm._tile_config(D, elements)
            return rows, block_d, warps or default_warps
        return tile
    return ("kernels.norm", chooser, wrap)


def _norm_fwd(elements: int, warps: int | None = None):
    return _norm_tile("_forward_tile", elements, warps)


def _norm_bwd(elements: int, warps: int | None = None):
    return _norm_tile("_backward_tile", elements, warps)


NORM_FORWARD = {
    "fwd tile 1024": _norm_fwd(1024),
    "fwd tile 2048, 4 warps": _norm_fwd(2048, 4),
    "fwd tile 4096": _norm_fwd(4096),
    "fwd tile 4096, 8 warps": _norm_fwd(4096, 8),
    "fwd tile 8192": _norm_fwd(8192),
    "fwd tile 16384": _norm_fwd(16384),
    # fewer threads a row tile: more values a thread (2 warps: 16), more programs an SM
    "fwd tile 512, 2 warps": _norm_fwd(512, 2),
    "fwd tile 1024, 2 warps": _norm_fwd(1024, 2),
    "fwd tile 256, 1 warp": _norm_fwd(256, 1),
    "fwd tile 512, 1 warp": _norm_fwd(512, 1),
    "fwd tile 1024, 1 warp": _norm_fwd(1024, 1),
    "fwd tile 2048, 1 warp": _norm_fwd(2048, 1),
    "fwd tile 2048, 2 warps": _norm_fwd(2048, 2),
    "fwd tile 1024, 8 warps": _norm_fwd(1024, 8),
    "fwd 4 programs an SM, looping": ("kernels.norm", "FWD_PROGRAMS_PER_SM", lambda base: 4),
    "fwd 8 programs an SM, looping": ("kernels.norm", "FWD_PROGRAMS_PER_SM", lambda base: 8),
    "fwd 8 programs an SM, tile 4096": [("kernels.norm", "FWD_PROGRAMS_PER_SM", lambda base: 8), _norm_fwd(4096)],
    "fwd 8 programs an SM, tile 2048, 4 warps": [("kernels.norm", "FWD_PROGRAMS_PER_SM", lambda base: 8),
                                                 _norm_fwd(2048, 4)],
    "fwd 16 programs an SM, looping": ("kernels.norm", "FWD_PROGRAMS_PER_SM", lambda base: 16),
    "fwd 12 programs an SM, looping": ("kernels.norm", "FWD_PROGRAMS_PER_SM", lambda base: 12),
}
NORM_BACKWARD = {
    "bwd tile 4096": _norm_bwd(4096),
    "bwd tile 8192, 8 warps": _norm_bwd(8192, 8),
    "bwd tile 4096, 4 warps": _norm_bwd(4096, 4),
    "bwd tile 2048, 2 warps": _norm_bwd(2048, 2),
    "bwd tile 1024, 2 warps": _norm_bwd(1024, 2),
    "bwd tile 1024, 1 warp": _norm_bwd(1024, 1),
    "bwd tile 512, 1 warp": _norm_bwd(512, 1),
    "bwd tile 16384": _norm_bwd(16384),
    "bwd 2x programs": ("kernels.norm", "_partials", lambda base: _more_programs(base, 2)),
    "bwd 4x programs": ("kernels.norm", "_partials", lambda base: _more_programs(base, 4)),
    "bwd 2x programs, tile 4096, 4 warps": [("kernels.norm", "_partials", lambda base: _more_programs(base, 2)),
                                            _norm_bwd(4096, 4)],
    "bwd half the programs": ("kernels.norm", "_partials", lambda base: _more_programs(base, 0.5)),
    "bwd a quarter of the programs": ("kernels.norm", "_partials", lambda base: _more_programs(base, 0.25)),
}
VARIANTS["rms_norm_gated"] = {"default": [], **NORM_FORWARD, **NORM_BACKWARD}
VARIANTS["rms_norm"] = {"default": [], **NORM_FORWARD, **NORM_BACKWARD}
# the gated norm at the layer's default value head, D = 512 (one row a 512-value tile)
VARIANTS["rms_norm_gated_v512"] = {
    "default": [],
    **{label: NORM_FORWARD[label] for label in ("fwd tile 1024", "fwd tile 512, 2 warps", "fwd tile 1024, 2 warps",
                                                "fwd tile 2048, 4 warps", "fwd tile 1024, 1 warp")},
    **NORM_BACKWARD,
}

# either side of it: the backward tiles behind BWD_TILE_ELEMENTS_GATED at rows of 256 and 1024
for _width in (256, 1024):
    VARIANTS[f"rms_norm_gated_v{_width}"] = {"default": [], **NORM_BACKWARD}


def _attention(**kernels):
    """parallel_attn's blocks of the named kernels (fwd, dkdv, dq) replaced: (BM, BN, warps, stages[, descriptors])."""
    import dataclasses

    def wrap(base):
        from kernels.attention.parallel import Blocks
        return lambda *a: dataclasses.replace(base(*a), **{n: Blocks(*b) for n, b in kernels.items()})
    return ("kernels.attention.parallel", "attention_configs", wrap)


VARIANTS["parallel_attn_vs_sdpa"] = {
    "default": [],
    "dq 64 x 64, pointer loads (before)": _attention(dq=(64, 64, 4, 2)),
    # dk/dv's query loop in three segments (Blocks.segments), pointer loads: the default before
    "dk/dv three segments, pointer loads (before)": _attention(dkdv=(64, 64, 4, 2)),
    "dk/dv three segments, descriptors": _attention(dkdv=(64, 64, 4, 2, True)),
    "dk/dv one masked loop, pointer loads": _attention(dkdv=(64, 64, 4, 2, False, False)),
    "dk/dv one masked loop, 64 x 128, 8 warps": _attention(dkdv=(64, 128, 8, 2, True, False)),
}
# packed sequences' blocks as they lie, before the heaviest-first tables
VARIANTS["parallel_attn_varlen"] = {
    "default": [],
    "dk/dv three segments (before)": _attention(dkdv=(64, 64, 4, 2, True)),
    "tables in order (before)": ("kernels.attention.parallel", "_blocks_grid",
                                 lambda base: lambda B, T, offsets, block, device, order=None: base(B, T, offsets, block, device)),
}
def _hgrn(chunk=None, NC=None):
    """Override chunk_hgrn's configs: the chunk kernels' (BD, num_warps), the summary's maps a scan step."""
    def wrap(base):
        def configs(D):
            cfg = dict(base(D))
            if chunk:
                cfg["chunk"] = dict(BD=chunk[0], num_warps=chunk[1])
            if NC:
                cfg["carry"] = dict(NC=NC)
            return cfg
        return configs
    return ("kernels.hgrn.chunk", "configs", wrap)


# memory-bound at D = 2048: wider channel blocks (fewer programs, longer rows a load),
# narrower (more programs resident), and the summary's scan step
VARIANTS["chunk_hgrn"] = {
    "default": [],
    "BD 128, 4 warps": _hgrn(chunk=(128, 4)),
    "BD 128, 8 warps": _hgrn(chunk=(128, 8)),
    "BD 64, 2 warps": _hgrn(chunk=(64, 2)),
    "BD 64, 8 warps": _hgrn(chunk=(64, 8)),
    "BD 32, 2 warps": _hgrn(chunk=(32, 2)),
    "BD 32, 4 warps": _hgrn(chunk=(32, 4)),
    "NC 4": _hgrn(NC=4),
    "NC 16": _hgrn(NC=16),
}
# l2norm's backward has no parameter gradient: one row block a program, like the forward
VARIANTS["l2norm"] = {
    "default": [],
    **NORM_FORWARD,
    **{f"bwd tile {n}": ("kernels.norm", "BWD_TILE_ELEMENTS_NO_PARAMS", lambda base, n=n: n) for n in (1024, 4096, 8192)},
}
VARIANTS["rotary"] = {
    "default": [],
    "tile 4096": ("kernels.rotary", "_tile_config", lambda base: lambda H, width, elements=8192: base(H, width, 4096)),
    "tile 16384": ("kernels.rotary", "_tile_config", lambda base: lambda H, width, elements=8192: base(H, width, 16384)),
}


# Variants that replace a @triton.jit helper: a kernel's compiled code is keyed by its own
# arguments, not by the helpers it called when first compiled, so each of these is timed in
# a process of its own, where the first compile already sees the replacement.
def _levels(form: str):
    import level_variants

    return level_variants.patches(getattr(level_variants, form))


OWN_PROCESS = {"sibling totals by reduction", "sibling totals by reduction, intra 16 warps", "sibling totals by product",
               "cost: levels without gathers"}
for _op in ("chunk_gla", "chunk_kda"):
    VARIANTS[_op]["sibling totals by reduction"] = _levels("sibling_total_by_reduction")
    VARIANTS[_op]["sibling totals by product"] = _levels("sibling_total_by_product")
VARIANTS["chunk_gla"]["sibling totals by reduction, intra 16 warps"] = (
    _levels("sibling_total_by_reduction") + [_gla(intra={"num_warps": 16})])
VARIANTS["chunk_dplr_delta_rule"]["sibling totals by product"] = _levels("sibling_total_by_product")
VARIANTS["chunk_gla"]["cost: levels without gathers"] = _levels("sibling_total_none")
for _op in ("chunk_gla", "chunk_kda", "chunk_dplr_delta_rule"):
    VARIANTS[_op]["sibling totals by scan"] = _levels("sibling_total_by_scan")
    OWN_PROCESS.add("sibling totals by scan")


# The gate-level kernels as they were before the one-product form (kernels/_gate_levels.py):
# no work dtype has a one-product limit, so every program takes the levels.
LEVELS_ALWAYS = ("kernels._gate_levels", "SPREAD_BY_WORK", lambda base: {})
VARIANTS.setdefault("chunk_rwkv6", {"default": []})
for _op in ("chunk_gla", "chunk_rwkv6", "chunk_kda", "chunk_dplr_delta_rule"):
    VARIANTS[_op]["levels always (before)"] = LEVELS_ALWAYS
# chunk_rwkv6 runs chunk_gla's kernels: the pair-precision variants time it too (its bonus
# row makes its backward the heavier)
VARIANTS["chunk_rwkv6"].update({label: v for label, v in VARIANTS["chunk_gla"].items()
                                if label.startswith(("qkg tf32", "qkg fp16", "qkg bf16"))})


def _more_programs(partials_module, factor: float):
    """A stand-in for ``kernels._partials`` whose ``partial_programs`` plans ``factor`` times
    the programs (capped by the work items; a factor under 1: fewer)."""
    import types

    def partial_programs(device, work_items, num_warps):
        planned = partials_module.partial_programs(device, work_items, num_warps)
        return max(1, min(work_items, int(factor * planned)))
    return types.SimpleNamespace(partial_programs=partial_programs, column_sum=partials_module.column_sum,
                                 multiprocessor_count=partials_module.multiprocessor_count)


def variants_of(op: str) -> dict:
    """The op's variants; an op without a table is timed as it is (and against a baseline)."""
    return VARIANTS.get(op, {"default": []})


def _patches(patch) -> list:
    return patch if isinstance(patch, list) else [patch]


def apply(op: str, label: str) -> list:
    """Apply a variant's patches; returns what undoes them."""
    return apply_patches(variants_of(op)[label])


def apply_patches(patch) -> list:
    """Apply ``(module, attr, wrap)`` patches (one or a list): ``attr`` becomes
    ``wrap(attr)``. Returns what undoes them (``_restore``)."""
    import importlib

    undo = []
    for module, attr, wrap in _patches(patch):
        mod = importlib.import_module(module)
        base = getattr(mod, attr)
        undo.append((mod, attr, base))
        setattr(mod, attr, wrap(base))
    return undo


def _bench_entry(op: str):
    sys.path.insert(0, HERE)
    import bench

    return next(b for b in bench.BENCHES if b.name == op), bench


def _side(op: str):
    """The op of this tree on the bench's inputs (``bench.Side``: forward, forward+backward)."""
    b, bench = _bench_entry(op)
    obj = bench.resolve(b.ours)
    return bench.Side(b.build(obj) if b.build else obj, b.call or bench.strict_call, b.inputs(), b.grads)


def _restore(undo):
    for mod, attr, base in undo:
        setattr(mod, attr, base)


LOST = "not run: an earlier variant's CUDA fault"


def time_variants(op: str, labels: list[str], rounds: int, baseline: str | None, profile: bool,
                  graphs: bool = False) -> dict:
    """In this process: ``op``'s variants, each timed once per round, medians over rounds.
    ``graphs``: each variant's call captured once in a CUDA graph and the replay timed (its
    kernels' time, no host time: ``bench.Side.graphed``)."""
    sys.path.insert(0, HERE)
    import bench  # this tree's bench on the path first; a baseline's kernels go before it

    if baseline:
        sys.path.insert(0, os.path.abspath(baseline))
    import torch
    from triton.testing import do_bench

    results = {label: {"fwd": [], "fwd_bwd": []} for label in labels}
    errors, sides = {}, {}
    for label in labels:  # compile and warm each variant; host code reads the configs at each call
        undo = [] if baseline else apply(op, label)
        try:
            side = _side(op)
            side.forward()
            side.forward_backward()
            if graphs:  # captured under this variant's patches: the replays need none
                side.graphed("fwd"), side.graphed("fwd_bwd")
            torch.cuda.synchronize()
            sides[label] = side
        except Exception as e:  # noqa: BLE001 - reported in the table
            errors[label] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            if "CUDA" in errors[label]:
                # a fault (an illegal address) leaves the process's CUDA context unusable: every
                # other label, warmed or not, is timed by a fresh process (``main``)
                for other in labels:
                    if other not in errors:
                        errors[other] = LOST
                sides.clear()
                break
        finally:
            _restore(undo)
    for r in range(rounds):
        for label in (labels if r % 2 == 0 else labels[::-1]):
            if label not in sides:
                continue
            side = sides[label]
            undo = [] if baseline else apply(op, label)
            try:
                for mode in ("fwd", "fwd_bwd"):
                    fn, grad_to_none = bench.timed_call(side, mode + ("_graph" if graphs else ""))
                    results[label][mode].append(do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none,
                                                         return_mode="median"))
            finally:
                _restore(undo)
    out = {}
    for label in labels:
        if label in errors:
            out[label] = {"error": errors[label]}
        elif results[label]["fwd"]:
            out[label] = {m: statistics.median(v) for m, v in results[label].items()}
            out[label].update({f"{m}_range": [min(v), max(v)] for m, v in results[label].items()})
    if profile and (baseline or labels[0] == "default") and labels[0] in sides and labels[0] in out:
        undo = [] if baseline else apply(op, labels[0])
        try:
            out[labels[0]]["kernels"] = kernel_shares(sides[labels[0]])
        finally:
            _restore(undo)
    return out


def kernel_shares(side, calls: int = 5, top: int = 10) -> dict:
    """Per mode: each GPU kernel's time per call in ms (torch.profiler), largest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    shares = {}
    for mode, fn in (("fwd", side.forward), ("fwd_bwd", side.forward_backward)):
        fn = side.call_as_timed(fn)
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        rows = []
        for event in prof.key_averages():
            total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
            if total:
                rows.append((event.key[:60], round(total / 1e3 / calls, 4), event.count // calls))
        shares[mode] = sorted(rows, key=lambda r: -r[1])[:top]
    return shares


def _python(code: str, timeout: int):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _prelude() -> str:
    return f"import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {HERE!r}); import config_sweep as s; "


def compile_variant(op: str, label: str, baseline: str | None) -> str | None:
    """Compile (and warm) one variant in its own process; the error's last line, or None."""
    call = f"s.time_variants({op!r}, [{label!r}], 0, {baseline!r}, False)"
    try:
        r = _python(_prelude() + f"import json; print(json.dumps({call}))", 500)
    except subprocess.TimeoutExpired:
        return "compile timed out"
    if r.returncode != 0:
        return (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    try:
        return json.loads(r.stdout.strip().splitlines()[-1]).get(label, {}).get("error")
    except (ValueError, IndexError):
        return "no result"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="chunk_gla,fused_recurrent_gla,fused_recurrent_simple_gla,causal_conv1d")
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--phase", choices=("compile", "time", "all"), default="all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="a tree holding the kernels/ package to compare with")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--graphs", action="store_true", help="time each call's CUDA-graph replay (no host time)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--match", default=None, help="only the variants whose label matches this regex (and the default)")
    args = ap.parse_args()
    if args.match:
        import re

        for op in list(VARIANTS):
            VARIANTS[op] = {label: p for label, p in VARIANTS[op].items()
                            if label == "default" or re.search(args.match, label)}
    ops = args.ops.split(",")
    baseline = args.baseline if args.baseline and os.path.isdir(os.path.join(args.baseline, "kernels")) else None
    if args.baseline and not baseline:
        print(f"no kernels/ under {args.baseline}: no baseline", flush=True)
    if args.phase != "time":
        # the defaults first: the other variants share most of their kernels (Triton's
        # cache), which processes started together would each compile again
        first = [(op, "default", None) for op in ops] + [(op, "default", baseline) for op in ops if baseline]
        rest = [(op, label, None) for op in ops for label in variants_of(op) if label != "default"]
        for todo in (first, rest):
            with ThreadPoolExecutor(args.jobs) as pool:
                errors = list(pool.map(lambda t: compile_variant(*t), todo))
            for (op, label, base), err in zip(todo, errors):
                if err:
                    print(f"compile {op} {'baseline' if base else label}: {err}", flush=True)
        if args.phase == "compile":
            return
    rows = []
    for op in ops:
        shared = [label for label in variants_of(op) if label not in OWN_PROCESS]
        runs = ([(shared, None)] + [([label], None) for label in variants_of(op) if label in OWN_PROCESS]
                + ([(["default"], baseline)] if baseline else []))
        while runs:
            labels, base = runs.pop(0)
            code = _prelude() + f"import json; print(json.dumps(s.time_variants({op!r}, {labels!r}, {args.rounds}, {base!r}, {args.profile}, {args.graphs})))"
            try:
                r = _python(code, 560)
                result = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
                why = None if result is not None else (r.stderr.strip().splitlines() or ["?"])[-1]
            except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
                result, why = None, f"{type(e).__name__}"
            lost = [label for label in labels if (result or {}).get(label, {}).get("error") == LOST]
            if lost:  # the variants after a CUDA fault, in a fresh process (the fault's own row stays)
                runs.insert(0, (lost, base))
            for label in labels:
                if label in lost:
                    continue
                name = "baseline" if base else label
                got = (result or {}).get(label) or {"error": why or "not timed"}
                rows.append({"op": op, "variant": name, **got})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "command": " ".join(sys.argv)}, f, indent=1)
    print(format_table(rows))


def format_table(rows) -> str:
    lines = ["| op | variant | fwd ms (min-max) | fwd+bwd ms (min-max) |", "|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['op']} | {r['variant']} | {r['error'][:60]} | |")
            continue
        cells = [f"{r[m]:.3f} ({r[m + '_range'][0]:.3f}-{r[m + '_range'][1]:.3f})" for m in ("fwd", "fwd_bwd")]
        lines.append(f"| {r['op']} | {r['variant']} | {cells[0]} | {cells[1]} |")
    for r in rows:
        for mode, kernels in r.get("kernels", {}).items():
            lines.append(f"{r['op']} {r['variant']} {mode}: " + ", ".join(f"{name} {ms:.3f} ms x{n}" for name, ms, n in kernels))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
