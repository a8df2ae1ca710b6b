"""``python -m pytest_fla mutate``: its operators, mutant ids, site discovery, selection,
outcome rules, and runs on the example repository (``examples/token_cumsum``)."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_fla.mutation import plan, report
from pytest_fla.mutation.child import refused_by_triton
from pytest_fla.mutation.operators import REWRITES, SourceMap, edits, jit_functions
from pytest_fla.mutation.runner import Outcome, Workspace, classify, conformance_modules, project_files
from pytest_fla.mutation.sites import Mutant, mutants_of

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "token_cumsum"
SCAN = "token_cumsum/op.py::_scan_kernel"

KERNEL = '''\
import triton
import triton.language as tl


def host(x):
    return x + 1


@triton.jit
def norm(x, y, D, eps, BLOCK: tl.constexpr):
    """rows of x, normalised"""
    i_h = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    v = tl.load(x + i_h * D + c, mask=c < D, other=0.0)
    ss = tl.sum(v[:, None] * v[:, None], axis=1)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(4):
        acc += v
    tl.store(y + i_h * D + c, v * tl.math.rsqrt(tl.maximum(ss + eps, 0.5)), mask=c < D)
'''


def _edits(text: str):
    source = SourceMap(text)
    (fn,) = jit_functions(ast.parse(text))
    return source, edits(fn, source)


def test_operators_make_the_planned_edits_and_nothing_else():
    source, found = _edits(KERNEL)
    made = {(e.operator, e.original, e.replacement) for e in found}
    for expected in [
        ("compare_flip", "<", "<="),
        ("off_by_one", "D", "D - 1"),
        ("off_by_one", "x + i_h * D + c", "x + i_h * D + c + 1"),
        ("off_by_one", "4", "4 - 1"),
        ("drop_term", "ss + eps", "ss"),
        ("drop_term", "+=", "="),
        ("scale_term", "eps", "2 * eps"),
        ("scale_term", "i_h * D", "2 * (i_h * D)"),
        ("wrong_index", "i_h", "(i_h ^ 1)"),
        ("swap_broadcast", "[:, None]", "[None, :]"),
        ("change_constant", "0.0", "1.0"),
        ("change_constant", "0.5", "1.0"),
        ("change_constant", "1", "0"),
        ("change_constant", "maximum", "minimum"),
    ]:
        assert expected in made, expected
    # the host function, the docstring and the signature are never touched
    assert not any("x + 1" == e.original or "rows of x" in e.original for e in found)
    for edit in found:
        mutated = source.text[:edit.start] + edit.replacement + source.text[edit.end:]
        ast.parse(mutated)  # valid Python
        assert mutated[:edit.start] == KERNEL[:edit.start]
        assert mutated[edit.start + len(edit.replacement):] == KERNEL[edit.end:]


def test_mutant_ids_survive_unrelated_edits(tmp_path):
    def ids(text):
        (tmp_path / "k.py").write_text(text)
        lines = set(range(1, text.count("\n") + 2))
        return {m.id for m in mutants_of(tmp_path, {"k.py": lines})}

    before = ids(KERNEL)
    edited = KERNEL.replace("def host(x):\n    return x + 1\n", "def host(x):\n    y = x * 3\n    return y + 1\n\n\n# note\n")
    assert ids(edited) == before
    # two equal edits of one function differ by their occurrence index
    assert "k.py::norm::swap_broadcast::[:, None] -> [None, :]#0" in before
    assert "k.py::norm::swap_broadcast::[:, None] -> [None, :]#1" in before


def test_only_reached_lines_have_sites(tmp_path):
    (tmp_path / "k.py").write_text(KERNEL)
    line = next(i for i, text in enumerate(KERNEL.splitlines(), 1) if "acc += v" in text)
    found = mutants_of(tmp_path, {"k.py": {line}})
    assert found and all(m.line == line for m in found)
    assert {m.operator for m in found} == {"drop_term", "scale_term"}


def _mutants(n_functions=2):
    return [Mutant(f"f.py::fn{f}::{op}::a -> b#{i}", "f.py", f"fn{f}", op, 1, 0, 1, "a", "b")
            for op in ("compare_flip", "drop_term", "off_by_one") for f in range(n_functions) for i in range(5)]


def test_selection_is_seeded_and_spread_over_operators_and_functions():
    mutants = _mutants()
    chosen = plan.select(mutants, "op", 6, seed=0)
    assert len(chosen) == 6 and chosen == plan.select(mutants, "op", 6, seed=0)
    assert {m.operator for m in chosen} == {"compare_flip", "drop_term", "off_by_one"}
    assert {(m.operator, m.function) for m in chosen} == {(o, f"fn{f}") for o in ("compare_flip", "drop_term", "off_by_one") for f in range(2)}
    assert plan.select(mutants, "op", 6, seed=1) != chosen
    order = plan.spread(mutants, "op", 0)
    assert sorted(m.id for m in order) == sorted(m.id for m in mutants)  # every one, to replace invalid ones


def test_equivalence_list_needs_reasons_and_flags_stale_entries(tmp_path):
    listed = tmp_path / "equivalent.toml"
    listed.write_text('[[equivalent]]\nid = "x"\nreason = "masked lanes are never stored"\n'
                      '[[equivalent]]\nid = "y"\nreason = "unread on its path"\nops = ["a"]\n')
    entries = plan.load_equivalent(listed)
    assert plan.equivalent_reason(entries, "x", "any") == "masked lanes are never stored"
    assert plan.equivalent_reason(entries, "y", "a") == "unread on its path"
    assert plan.equivalent_reason(entries, "y", "b") is None  # for the listed ops only
    listed.write_text('[[equivalent]]\nid = "x"\n')
    with pytest.raises(SystemExit, match="reason"):
        plan.load_equivalent(listed)
    mutant = _mutants(1)[0]
    survived = report.result_entry(mutant, Outcome("survived", 1.0), "why")
    assert survived["outcome"] == "equivalent"
    killed = report.result_entry(mutant, Outcome("killed", 1.0, killed_by="test_forward[x]"), "why")
    assert killed["outcome"] == "killed" and killed["stale_equivalence_entry"]
    counts = report.tally([survived, killed, {"outcome": "invalid"}, {"outcome": "survived"}])
    assert report.score(counts) == 0.5  # killed / (total - equivalent - invalid)

    # a recorded run judged again by the list as it is now
    from pytest_fla.mutation.command import rescore

    recorded = tmp_path / "run.json"
    recorded.write_text(json.dumps({"runs": [], "ops": {"a": {"sites": 3, "mutants": [
        {"id": "y", "outcome": "survived"}, {"id": "x", "outcome": "equivalent", "equivalent_reason": "old"},
        {"id": "z", "outcome": "survived"}]}}}))
    rescore(recorded, entries)
    outcomes = {m["id"]: m["outcome"] for m in json.loads(recorded.read_text())["ops"]["a"]["mutants"]}
    assert outcomes == {"y": "equivalent", "x": "equivalent", "z": "survived"}


def test_triton_refusing_the_code_is_invalid_a_check_failing_is_a_kill(tmp_path):
    import torch

    from pytest_fla.running.devices import numeric_device

    # a kernel whose two ranges cannot broadcast: the compiler refuses it, and so does the
    # interpreter (an InterpreterError around its shape error)
    (tmp_path / "broken_kernel.py").write_text(textwrap.dedent('''
        import triton
        import triton.language as tl

        @triton.jit
        def broken(y):
            tl.store(y + tl.arange(0, 16), tl.arange(0, 16) + tl.arange(0, 8))
    '''))
    spec = importlib.util.spec_from_file_location("broken_kernel", tmp_path / "broken_kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    y = torch.zeros(16, device=numeric_device())
    with pytest.raises(Exception) as refused:
        module.broken[(1,)](y)
    assert refused_by_triton(refused.value) is not None
    assert refused_by_triton(AssertionError("l2norm.y: rel_rms 0.3 > 2e-05")) is None
    # a read past a tensor's end, found by the interpreter's access check: a finding, not a refusal
    from pytest_fla.running.devices import is_interpreter

    if is_interpreter():
        (tmp_path / "reads_past.py").write_text(textwrap.dedent('''
            import triton
            import triton.language as tl

            @triton.jit
            def reads_past(x, y):
                offs = tl.arange(0, 16)
                tl.store(y + offs, tl.load(x + offs + 1))
        '''))
        spec = importlib.util.spec_from_file_location("reads_past", tmp_path / "reads_past.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with pytest.raises(Exception, match="outside every tensor argument") as found:
            module.reads_past[(1,)](torch.zeros(16), torch.zeros(16))
        assert refused_by_triton(found.value) is None

    def first(error, refused_by=None):
        return {"first_failure": {"test": "test_forward[op-fp32-plain]", "error": error, "message": "m",
                                  "refused_by": refused_by}, "counts": {"failed": 1}}

    assert classify(1, 1.0, "", first("InterpreterError", "InterpreterError")).status == "invalid"
    assert classify(1, 1.0, "", first("CompilationError", "CompilationError")).status == "invalid"
    killed = classify(1, 1.0, "", first("AssertionError"))
    assert (killed.status, killed.killed_by) == ("killed", "test_forward[op-fp32-plain]")
    crashed = classify(-11, 1.0, "", {"running": "test_varlen[op-fp32-equal-int32]"})
    assert (crashed.status, crashed.killed_by) == ("killed", "test_varlen[op-fp32-equal-int32]")
    assert classify(None, 9.0, "", {}).status == "timeout"
    assert classify(0, 1.0, "", {"counts": {"passed": 3}, "mutated_file_imported": True}).status == "survived"
    assert classify(0, 1.0, "", {"counts": {"passed": 3}, "mutated_file_imported": False}).status == "error"


def _example_spec():
    """The example repository's spec, imported from its conftest as its own tests do."""
    for path in (str(EXAMPLE), str(EXAMPLE / "tests")):
        if path not in sys.path:
            sys.path.insert(0, path)
    spec = importlib.util.spec_from_file_location("token_cumsum_conftest", EXAMPLE / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TOKEN_CUMSUM


def test_sites_of_the_example_repository(monkeypatch):
    from pytest_fla.running.devices import numeric_device
    from pytest_fla.mutation.sites import reached_by

    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")  # natively, the code generator must visit every kernel
    reached = reached_by(_example_spec(), numeric_device(), EXAMPLE)
    assert list(reached) == ["token_cumsum/op.py"]
    mutants = mutants_of(EXAMPLE, {p: set(lines) for p, lines in reached.items()})
    ids = {m.id for m in mutants}
    assert all(i.startswith(SCAN + "::") for i in ids)
    # forward and backward (REVERSE), dense and packed (VARLEN) branches are all reached
    for expected in ("::off_by_one::cu_seqlens + n + 1 -> cu_seqlens + n + 1 + 1#0",
                     "::drop_term::eos - 1 - i -> eos - 1#0",
                     "::drop_term::base + t -> base#0",
                     "::drop_term::+= -> =#1"):
        assert SCAN + expected in ids, expected
    assert len({m.operator for m in mutants}) >= 5


def test_a_run_on_the_example_kills_one_mutant_and_not_an_equivalent_one(tmp_path):
    """Each mutant in the example's copy, the way the command runs it: dropping the
    running sum's accumulation is caught, and the ``other`` of a masked load whose lanes
    are never stored is not (an equivalent mutant)."""
    files = project_files(EXAMPLE)
    workspace = Workspace(EXAMPLE, files, tmp_path, 0)
    tests = conformance_modules(workspace.path, files)
    assert tests == ["tests/test_conformance.py"]
    reached = {"token_cumsum/op.py": set(range(1, 200))}
    by_id = {m.id: m for m in mutants_of(workspace.path, reached)}
    device = "cuda" if _on_gpu() else "cpu"
    killed = workspace.run_checks("token_cumsum", tests, by_id[SCAN + "::drop_term::+= -> =#1"], device, 300)
    assert killed.status == "killed", killed
    assert killed.killed_by.startswith("test_forward[token_cumsum-")
    survived = workspace.run_checks("token_cumsum", tests, by_id[SCAN + "::change_constant::0.0 -> 1.0#1"], device, 300)
    assert survived.status == "survived", survived
    assert survived.counts["passed"] > 0
    assert (workspace.path / "token_cumsum" / "op.py").read_text() == (EXAMPLE / "token_cumsum" / "op.py").read_text()


def _on_gpu() -> bool:
    from pytest_fla.running.devices import numeric_device

    return numeric_device().type == "cuda"


def test_a_rerun_mutant_replaces_only_its_own_ops_record(tmp_path):
    """A shared helper's mutant has one id in every op that runs it: rerunning it for one op
    (``--mutant ID --fla-ops=a``) keeps the other op's record of it."""
    from pytest_fla.mutation.command import _continued

    shared, own = "kernels/norm.py::_param_tile::compare_flip::< -> <=#0", "kernels/norm.py::other#0"
    path = tmp_path / "mutation.json"
    path.write_text(json.dumps({"runs": [{}], "ops": {
        "a": {"mutants": [{"id": shared, "status": "survived"}, {"id": own, "status": "killed"}]},
        "b": {"mutants": [{"id": shared, "status": "survived"}]}}}))
    document = _continued(path, {"a": []}, {"a": {shared}})
    assert document["ops"]["a"]["mutants"] == [{"id": own, "status": "killed"}]
    assert document["ops"]["b"]["mutants"] == [{"id": shared, "status": "survived"}]


def test_the_error_ratchet_holds_a_comparison_to_its_recorded_errors(tmp_path, monkeypatch):
    """Recorded by ``FLA_RECORD_ERRORS``, held by ``FLA_ERROR_BASELINE``: the same error
    passes, half as much again fails though inside the limit, a zero recording
    leaves the floor, and a comparison the recording lacks is judged by the limits alone."""
    import torch

    from pytest_fla.checks import tolerance

    ref = torch.linspace(1.0, 2.0, 1000, dtype=torch.float64)
    noise = torch.sin(torch.arange(1000, dtype=torch.float64))  # RMS 0.707, max 1.0
    recorded = tmp_path / "errors.jsonl"
    test = "test_forward[op-fp32]"  # a node id, as PYTEST_CURRENT_TEST names it
    monkeypatch.setenv("PYTEST_CURRENT_TEST", test + " (call)")
    monkeypatch.setenv("FLA_RECORD_ERRORS", str(recorded))
    tolerance.assert_close("o", ref + 1e-5 * noise, ref, "fp32")
    tolerance.assert_close("o", ref, ref, "fp32")  # the same tensor compared twice: kept in order
    monkeypatch.delenv("FLA_RECORD_ERRORS")
    monkeypatch.setenv("FLA_ERROR_BASELINE", str(recorded))
    monkeypatch.setattr(tolerance, "_compared", {})
    tolerance.assert_close("o", ref + 1e-5 * noise, ref, "fp32")
    tolerance.assert_close("o", ref + 1e-7 * noise, ref, "fp32")  # under the floor (8 x 2^-24 = 4.8e-7)
    monkeypatch.setattr(tolerance, "_compared", {})
    with pytest.raises(AssertionError, match="error ratchet: o \\(fp32, forward\\)"):
        tolerance.assert_close("o", ref + 1.5e-5 * noise, ref, "fp32")  # 1.5x; the limit is 2e-5
    monkeypatch.setattr(tolerance, "_compared", {})
    tolerance.assert_close("o", ref + 1e-5 * noise, ref, "fp32")
    with pytest.raises(AssertionError, match="error ratchet"):
        tolerance.assert_close("o", ref + 3e-6 * noise, ref, "fp32")  # the second recording was exact
    tolerance.assert_close("o", ref + 2e-5 * noise, ref, "fp32")  # a third comparison: none recorded
    tolerance.assert_close("other", ref + 2e-5 * noise, ref, "fp32")  # nor of this tensor
    ratcheted = {"outcome": "killed", "detail": "AssertionError: error ratchet: o (fp32, forward): ..."}
    by_limit = {"outcome": "killed", "detail": "AssertionError: o (fp32, forward): relative RMS error ..."}
    counts = report.tally([ratcheted, by_limit, {"outcome": "survived"}])
    assert (counts["killed"], counts["ratchet"], report.score(counts)) == (2, 1, 2 / 3)
    header, _, row, _ = report.table({"a": {"sites": 9, "mutants": [ratcheted, by_limit]}}).splitlines()
    assert [c.strip() for c in header.split("|")][3:5] == ["killed", "ratchet"]
    assert [c.strip() for c in row.split("|")][3:5] == ["2", "1"]


def test_the_error_ratchet_kills_a_mutant_that_loses_accuracy_inside_the_limits(tmp_path):
    """The example's scan with each token scaled by 1 + 1e-6 (a constant written with too
    few digits): inside the fp32 limit (2e-5), so the limits let it survive; held to the
    unmutated run's recorded errors, it is killed, and the unmutated code is not."""
    files = project_files(EXAMPLE)
    workspace = Workspace(EXAMPLE, files, tmp_path, 0)
    tests = conformance_modules(workspace.path, files)
    device = "cuda" if _on_gpu() else "cpu"
    errors = tmp_path / "errors.jsonl"
    baseline = workspace.run_checks("token_cumsum", tests, None, device, 300, {"FLA_RECORD_ERRORS": str(errors)})
    assert baseline.status == "survived", baseline
    assert errors.read_text().count("\n") >= baseline.counts["passed"]
    ratchet = {"FLA_ERROR_BASELINE": str(errors)}
    again = workspace.run_checks("token_cumsum", tests, None, device, 300, ratchet)
    assert again.status == "survived", again  # the same code, held to its own record
    text = (EXAMPLE / "token_cumsum" / "op.py").read_text()
    load = "acc += tl.load(inp + offset, mask=mask, other=0.0).to(tl.float32)"
    start = text.index(load) + len(load)
    scaled = Mutant(id="scaled", path="token_cumsum/op.py", function="_scan_kernel", operator="hand", line=0,
                    start=start, end=start, original="", replacement=" * 1.000001")
    survived = workspace.run_checks("token_cumsum", tests, scaled, device, 300)
    assert survived.status == "survived", survived
    killed = workspace.run_checks("token_cumsum", tests, scaled, device, 300, ratchet)
    assert killed.status == "killed" and report.by_ratchet(killed.detail), killed


def test_survivors_of_a_recorded_run_are_chosen_per_op(tmp_path):
    """``--survivors-of``: each op runs again the mutants its own record left alive
    (survived or equivalent), not another op's of the same shared helper."""
    import argparse

    from pytest_fla.mutation.command import _wanted

    path = tmp_path / "mutation.json"
    path.write_text(json.dumps({"runs": [], "ops": {
        "a": {"mutants": [{"id": "s", "outcome": "survived"}, {"id": "k", "outcome": "killed"},
                          {"id": "e", "outcome": "equivalent"}, {"id": "i", "outcome": "invalid"}]},
        "b": {"mutants": [{"id": "s", "outcome": "killed"}]},
        "c": {"mutants": [{"id": "x", "outcome": "survived"}]}}}))
    args = argparse.Namespace(survivors_of=path, mutant=[])
    assert _wanted(args, {"a": {}, "b": {}, "d": {}}) == {"a": {"s", "e"}, "b": set()}
    assert _wanted(argparse.Namespace(survivors_of=None, mutant=["m"]), {"a": {}, "b": {}}) == {"a": {"m"}, "b": {"m"}}


def test_rewrites_change_only_the_rounding_and_leave_integer_offsets_alone():
    """The rewrite family: float sums and products reassociated, a division by a
    reciprocal (not where the numerator is +-1: exact by construction), ``exp`` by ``exp2``;
    offsets (no float in them) are not rewritten."""
    text = textwrap.dedent('''\
        import triton
        import triton.language as tl


        @triton.jit
        def k(x, y, s, D, BLOCK: tl.constexpr):
            c = tl.arange(0, BLOCK)
            b_x = tl.load(x + D + c + 1)
            b_y = b_x * s * 2.0 + tl.exp(-b_x) + b_x / D
            b_r = 1.0 / b_y - -1 / b_x
            tl.store(y + c, b_y + b_r)
        ''')
    source = SourceMap(text)
    (fn,) = jit_functions(ast.parse(text))
    found = {(e.operator, e.original, e.replacement) for e in edits(fn, source, rewrites=True)}
    assert found == {
        ("reassociate", "b_x * s * 2.0", "b_x * (s * 2.0)"),
        ("reassociate", "b_x * s * 2.0 + tl.exp(-b_x) + b_x / D", "(b_x * s * 2.0) + (tl.exp(-b_x) + (b_x / D))"),
        ("exp_as_exp2", "tl.exp(-b_x)", "tl.exp2((-b_x) * 1.4426950408889634)"),
        ("reciprocal", "b_x / D", "b_x * (1.0 / D)"),
    }  # not 1.0 / b_y nor -1 / b_x: a unit numerator's reciprocal form rounds as the division does
    assert all(op in REWRITES for op, _, _ in found)
    assert not any(e.operator in REWRITES for e in edits(fn, source))  # not among the bugs


def test_error_growth_against_the_baseline(tmp_path):
    def write(path, rows):
        path.write_text("".join(json.dumps({"test": "t", "tensor": n, "dtype": "fp32", "kind": "forward",
                                            "rel_rms": r, "max_abs": r}) + "\n" for n, r in rows))

    write(tmp_path / "base.jsonl", [("o", 1e-7), ("o", 2e-7), ("dq", 1e-7)])
    write(tmp_path / "run.jsonl", [("o", 1e-7), ("o", 3e-7)])  # stopped before dq (-x)
    growth = report.error_growth(tmp_path / "base.jsonl", tmp_path / "run.jsonl")
    assert growth["changed"] == 1 and growth["compared"] == 2
    floor = 8 * 2.0 ** -24  # fp32's floor
    assert growth["rms_ratio"] == pytest.approx((3e-7 + floor) / (2e-7 + floor), abs=1e-3)
    # 3e-7 against the limits 1.25 x 2e-7 + floor (relative RMS) and 2 x 2e-7 + floor (max)
    assert growth["limit_used"] == pytest.approx(3e-7 / (1.25 * 2e-7 + floor), abs=1e-3)
    write(tmp_path / "run.jsonl", [("o", 1e-7), ("o", 2e-7)])  # nothing changed: no share of a limit
    assert report.error_growth(tmp_path / "base.jsonl", tmp_path / "run.jsonl")["limit_used"] == 0
    write(tmp_path / "run.jsonl", [("o", 1e-7), ("o", 2.5e-7 + 1.01 * floor)])  # past the limit
    assert report.error_growth(tmp_path / "base.jsonl", tmp_path / "run.jsonl")["limit_used"] > 1


def test_a_rewrites_run_is_rescored_without_the_equivalence_list(tmp_path, capsys):
    from pytest_fla.mutation.command import rescore

    path = tmp_path / "rewrites.json"
    document = {"runs": [{"rewrites": True}], "ops": {"a": {"sites": 2, "mutants": [
        {"id": "x", "outcome": "survived"}, {"id": "y", "outcome": "killed", "detail": "error ratchet: ..."}]}}}
    path.write_text(json.dumps(document))
    rescore(path, {("x", None): "listed"})
    assert json.loads(path.read_text()) == document  # x stays survived: a rewrite is meant to
    assert "false fails" in capsys.readouterr().out
