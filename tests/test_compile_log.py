"""``benchmarks/compile_log.py``: a run's compiles against an earlier run's on the same cache."""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "benchmarks"))

import compile_log  # noqa: E402


def _lines(*calls):
    return [json.dumps({"pid": 1, "kernel": k, "key": key, "seconds": s, "at": at}) for k, key, s, at in calls]


def test_compiles_are_split_into_served_again_and_new_specialisations():
    earlier = _lines(("attn_fwd", "a", 9.0, 1.0), ("norm_fwd", "c", 0.5, 2.0))
    now = _lines(
        ("attn_fwd", "a", 15.0, 10.0),   # the earlier run compiled this key: the cache did not serve it
        ("attn_fwd", "a", 0.01, 30.0),   # a later hit of the same key: not counted
        ("conv_fwd", "b", 30.0, 12.0),   # a key the earlier run never met
        ("norm_fwd", "c", 0.01, 11.0),   # served by the cache: milliseconds
    )
    split = compile_log.against_earlier(now, earlier)
    assert split == {"again": [("attn_fwd", 15.0)], "new": [("conv_fwd", 30.0)]}
