"""``benchmarks/stack_frames.py``: the stack frames of a Triton cache's cubins, read with
``cuobjdump``, here a stand-in script printing canned resource usage."""

from __future__ import annotations

import json
import pathlib
import stat
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "benchmarks"))

import stack_frames  # noqa: E402

USAGE = """
Resource usage:
 Common:
  GLOBAL:0
 Function {name}:
  REG:{reg} STACK:{stack} SHARED:1024 LOCAL:{local} CONSTANT[0]:616 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_the_frame_is_stack_and_local_bytes():
    assert stack_frames.parse_usage(USAGE.format(name="k", reg=32, stack=9720, local=8)) == (32, 9728)
    with pytest.raises(ValueError, match="no resource usage"):
        stack_frames.parse_usage("cuobjdump info: no cubin")


def test_a_frame_is_reserved_for_every_thread_the_gpu_holds():
    # 9720 bytes, 2048 threads on each of the H100's 132 multiprocessors
    assert stack_frames.reserved_gib(9720, 132) == pytest.approx(2.447, abs=1e-3)


def test_every_cubin_is_read_and_the_largest_frame_comes_first(tmp_path):
    cache = tmp_path / "fla-sm90"
    for entry, (name, reg, stack, warps) in enumerate([("small", 255, 0, 8), ("spills", 32, 9720, 4)]):
        folder = cache / f"HASH{entry}"
        folder.mkdir(parents=True)
        (folder / f"{name}.cubin").write_text(USAGE.format(name=name, reg=reg, stack=stack, local=0))
        (folder / f"{name}.json").write_text(json.dumps({"num_warps": warps, "num_stages": 1}))
    tool = tmp_path / "cuobjdump"
    tool.write_text('#!/bin/sh\n[ "$1" = --dump-resource-usage ] && cat "$2"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    rows = stack_frames.frames(cache, str(tool))
    assert [(r["kernel"], r["frame"], r["registers"], r["warps"]) for r in rows] == [
        ("spills", 9720, 32, 4), ("small", 0, 255, 8)]
