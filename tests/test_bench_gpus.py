"""``benchmarks/bench.py --gpus N``: the ops dealt to one timing process per GPU, each pinned
to its GPU, and their reports merged into one, in the bench's order. The children here are
stand-ins that write a report as ``bench.py`` does (no GPU needed); the real run is
``python3 benchmarks/bench.py --gpus 2 --warm 14 --out DIR/NAME`` on a two-GPU host."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench  # noqa: E402

# A child that writes a report for its ops, as bench.py does after every op; the GPU it was
# pinned to goes into each row, and "stop" ends it before it writes anything.
CHILD = """
import json, os, sys
ops, out = sys.argv[1].split(","), sys.argv[2]
if "stop" in ops:
    sys.exit(1)
gpu = os.environ["CUDA_VISIBLE_DEVICES"]
host = {"cpus": 2, "noop_launch_us": 10.0, "load_average": 0.5}
rows = [{"op": op, "pinned": gpu, "host_load": 0.5, "fwd": {}} for op in ops]
json.dump({"device": "GPU " + gpu, "torch": "t", "triton": "tr", "copy_bandwidth_TBps": 4.0 + int(gpu),
           "matmul_TFLOPs": 700.0, "host": host, "rounds": 5, "rows": rows, "command": "child"}, open(out + ".json", "w"))
"""


def _child(i, ops, out):
    return [sys.executable, "-c", CHILD, ",".join(ops), out]


def test_ops_are_dealt_in_turn_and_each_once():
    names = [f"op{i}" for i in range(7)]
    shares = bench.split_over_gpus(names, 3)
    assert shares == [["op0", "op3", "op6"], ["op1", "op4"], ["op2", "op5"]]
    assert sorted(n for share in shares for n in share) == sorted(names)
    assert bench.split_over_gpus(["a"], 4) == [["a"]]  # no process without ops


def test_each_share_runs_pinned_to_its_gpu_and_the_reports_merge(tmp_path):
    names = ["chunk_gla", "rotary", "l2norm", "chunk_kda", "rms_norm"]
    out = str(tmp_path / "bench")
    report = bench.run_on_gpus(names, 2, out, [], command=_child)
    assert [row["op"] for row in report["rows"]] == names  # the bench's order, not the GPUs'
    for row in report["rows"]:
        assert row["pinned"] == str(row["gpu"])  # the process that timed it saw only its GPU
    assert [row["gpu"] for row in report["rows"]] == [0, 1, 0, 1, 0]
    assert [g["copy_bandwidth_TBps"] for g in report["per_gpu"]] == [4.0, 5.0]
    with open(out + ".json") as f:
        assert json.load(f)["rows"] == report["rows"]
    table = open(out + ".md").read()
    assert "Timed on 2 GPUs at once" in table and "- GPU 1: GPU 1, copy bandwidth 5.00 TB/s" in table
    assert "| fwd+bwd TFLOP/s | GPU |" in table and table.count("\n| rotary |") == 1


def test_a_gpu_that_left_nothing_drops_only_its_ops(tmp_path):
    out = str(tmp_path / "bench")
    report = bench.run_on_gpus(["chunk_gla", "stop", "l2norm"], 2, out, [], command=_child)
    assert [row["op"] for row in report["rows"]] == ["chunk_gla", "l2norm"]
    assert [g["gpu"] for g in report["per_gpu"]] == [0]
    with pytest.raises(RuntimeError, match="no GPU's run left a report"):
        bench.run_on_gpus(["stop"], 2, str(tmp_path / "none"), [], command=_child)


def _report(ops, rounds, command):
    rows = [{"op": op, "fwd": {"ratio": {"median": 1.0 + i, "min": 1.0, "max": 2.0}}} for i, op in enumerate(ops)]
    return {"date": "d", "device": "GPU", "torch": "t", "triton": "tr", "copy_bandwidth_TBps": 4.0, "matmul_TFLOPs": 700.0,
            "host": {"cpus": 2, "noop_launch_us": 10.0, "load_average": 0.5}, "rounds": rounds, "rows": rows, "command": command}


def test_a_partial_run_replaces_the_rows_it_timed_in_the_one_file(tmp_path):
    """``--merge RUN --into STEM``: the run's rows in place of the same ops' rows, the others
    kept in the bench's order, each row naming its run; a run left without a row is dropped."""
    order = ["a", "b", "c", "d"]
    stem = str(tmp_path / "bench_h200")
    for name, ops, rounds in (("whole", ["a", "b", "c"], 5), ("first", ["b"], 7), ("second", ["b", "d"], 9)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(_report(ops, rounds, name)))
        report = bench.merge_into(str(path), stem, order)
    assert [row["op"] for row in report["rows"]] == ["a", "b", "c", "d"]
    assert [report["runs"][row["run"]]["command"] for row in report["rows"]] == ["whole", "second", "whole", "second"]
    assert [run["command"] for run in report["runs"]] == ["whole", "second"]  # "first" has no row left
    assert bench.read_report(stem + ".json.gz") == report
    table = (tmp_path / "bench_h200.md").read_text()
    assert "medians of 5/9 interleaved rounds" in table and "- run 1: d, GPU" in table and "`second`" in table
    assert table.count("| b |") == 1
