"""benchmarks/peer_history.py: a release's run cut by a device call's limit goes on from
where it was, and the merged report holds every test once, its defects run again."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("peer_history", ROOT / "benchmarks" / "peer_history.py")
peer_history = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer_history)


def _test(nodeid, outcome, verdict=None, op="chunk_gla"):
    return {"nodeid": nodeid, "op": op, "check": "forward", "outcome": outcome, "verdict": verdict, "reason": ""}


def test_a_cut_run_keeps_its_tests_but_its_defects_and_a_resumed_run_merges(tmp_path):
    report = tmp_path / "report_0.6.0.json"
    cut = [_test("t::a", "passed"), _test("t::b", "failed", "contract"), _test("t::c", "failed", "defect"),
           _test("t::d", "skipped")]
    report.write_text(json.dumps({"tests": cut, "finished": False}))
    kept = peer_history.kept_tests(report)
    assert [t["nodeid"] for t in kept] == ["t::a", "t::b", "t::d"]  # the defect runs again
    # the resumed run: the defect again (now contract, after a fix of the checks) and the rest
    report.write_text(json.dumps({"tests": [_test("t::c", "failed", "contract"), _test("t::e", "failed", "defect")],
                                  "finished": True}))
    peer_history.merge_into(report, kept)
    merged = json.loads(report.read_text())
    assert sorted(t["nodeid"] for t in merged["tests"]) == ["t::a", "t::b", "t::c", "t::d", "t::e"]
    assert merged["finished"] and merged["verdicts"] == {"contract": 2, "defect": 1}


def test_a_finished_report_keeps_nothing_to_resume(tmp_path):
    report = tmp_path / "report_0.6.0.json"
    report.write_text(json.dumps({"tests": [_test("t::a", "passed")], "finished": True}))
    assert peer_history.kept_tests(report) == []
    assert peer_history.kept_tests(tmp_path / "missing.json") == []


def test_tests_skipped_after_a_device_fault_run_again_and_a_device_fault_does_not(tmp_path):
    report = tmp_path / "report_0.6.0.json"
    fault = dict(_test("t::f", "failed", "defect"), verdict_why="device fault")
    skipped = dict(_test("t::s", "skipped"), reason="not run: this process's CUDA context was lost to a device "
                   "fault in t::f (--fla-isolate=batch runs each batch in a fresh process)")
    report.write_text(json.dumps({"tests": [fault, skipped, _test("t::a", "passed")], "finished": True}))
    assert not peer_history.finished(report)  # ended, but not every test ran
    assert [t["nodeid"] for t in peer_history.kept_tests(report)] == ["t::f", "t::a"]


def test_an_agreement_defect_of_the_other_kernel_counts_against_that_kernel(tmp_path):
    """chunk_vs_recurrent[chunk_rwkv6] failing because fused_recurrent_rwkv6 alone is off the
    float64 reference is a defect in fused_recurrent_rwkv6's row, not chunk_rwkv6's."""
    from pytest_fla.report import verdicts

    other = dict(_test("t::agree", "failed", "defect", op="chunk_rwkv6"), check="chunk_vs_recurrent",
                 verdict_why=f"{verdicts.OTHER_KERNEL} fused_recurrent_rwkv6's")
    own = dict(_test("t::own", "failed", "defect", op="chunk_rwkv6"), check="huge_grid",
               verdict_why="launch refused on a valid input")
    (tmp_path / "report_0.5.2.json").write_text(json.dumps({"tests": [other, own], "finished": True}))
    ops = peer_history.matrix(tmp_path)["data"]["0.5.2"]["ops"]
    assert ops["chunk_rwkv6"]["defects"].keys() == {"huge_grid"}
    assert ops["fused_recurrent_rwkv6"]["defects"].keys() == {"chunk_vs_recurrent (chunk_rwkv6's)"}
    assert not ops["fused_recurrent_rwkv6"]["absent"]


def test_a_check_not_run_after_a_device_fault_is_not_shown_as_no_defect(tmp_path):
    """A cell whose check never ran (its process lost to an earlier test's device fault)
    says so, instead of the `-` of a check that ran and found nothing."""
    fault = dict(_test("t::f", "failed", "defect", op="chunk_kda"), check="error_inputs", verdict_why="device fault")
    lost = dict(_test("t::g", "skipped", op="chunk_kda"), check="huge_grid",
                reason="not run: this process's CUDA context was lost to a device fault in t::f")
    ran = _test("t::a", "passed", op="chunk_gla")
    (tmp_path / "report_0.6.0.json").write_text(json.dumps({"tests": [fault, lost, ran], "finished": True}))
    result = peer_history.matrix(tmp_path)
    assert result["data"]["0.6.0"]["ops"]["chunk_kda"]["not_run"] == ["huge_grid"]
    rows = {line.split(" | ")[0]: line for line in result["markdown"].splitlines() if line.startswith("| chunk_")}
    assert rows["| chunk_kda"] == "| chunk_kda | **error_inputs 1** (not run: huge_grid 1) |"
    assert rows["| chunk_gla"] == "| chunk_gla | - |"
