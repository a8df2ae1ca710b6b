"""The bench's timing loop (``benchmarks/bench.py``, ``time_rounds`` and ``timed_call``), which
``config_sweep.py`` shares: which callable each mode times, which gradients are cleared between
calls, and the interleaved order of the rounds. ``do_bench`` is replaced by a recorder (it
needs a GPU); the real loop ran on an H200 (``benchmarks/results/README.md``)."""

from __future__ import annotations

import os
import sys

import pytest
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench  # noqa: E402


class FakeSide:
    """A ``bench.Side`` with the attributes the timing loop reads."""

    def __init__(self, name):
        self.name = name
        self.grad_tensors = [f"{name}.grad"]

    def forward(self):
        return (self.name, "fwd")

    def forward_backward(self):
        return (self.name, "fwd_bwd")

    def graphed(self, mode):
        return lambda: (self.name, mode + " replay")


@pytest.mark.parametrize("mode, called, grads", [
    ("fwd", "fwd", None),
    ("fwd_bwd", "fwd_bwd", ["s.grad"]),
    ("fwd_graph", "fwd replay", None),
    ("fwd_bwd_graph", "fwd_bwd replay", None),
])
def test_each_mode_times_its_call_and_clears_only_eager_gradients(mode, called, grads):
    fn, grad_to_none = bench.timed_call(FakeSide("s"), mode)
    assert fn() == ("s", called)
    assert grad_to_none == grads


def test_rounds_alternate_the_order_and_time_every_side_once_a_round(monkeypatch):
    calls = []

    def recorder(fn, warmup, rep, grad_to_none=None, return_mode="mean"):
        calls.append((fn(), grad_to_none))
        return float(len(calls))

    monkeypatch.setattr(triton.testing, "do_bench", recorder)
    sides = {"ours": FakeSide("ours"), "peer": FakeSide("peer")}
    samples = bench.time_rounds(sides, "fwd_bwd", rounds=3, warmup_ms=1, rep_ms=1)
    assert [c[0][0] for c in calls] == ["ours", "peer", "peer", "ours", "ours", "peer"]
    assert all(c[0][1] == "fwd_bwd" and c[1] == [c[0][0] + ".grad"] for c in calls)
    assert samples == {"ours": [1.0, 4.0, 5.0], "peer": [2.0, 3.0, 6.0]}
