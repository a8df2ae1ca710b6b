"""--fla-arch=fleet: one run over the hosts of the user's xdist gateways.

The plan (which worker runs which arch where) is checked as data; the run itself end to
end with popen gateways standing in for hosts (``FLA_FLEET_STAND_IN``: the numeric checks
under the interpreter with that arch's configs), two of them per run. The same run on two
real GPUs, one gateway pinned to each: ``test_two_gpus_two_gateways``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import stat
import sys
import textwrap

import pytest

from plugin_testing import GPU, run

from pytest_fla import report
from pytest_fla.running import fleet
from pytest_fla.running.fleet import Host, HostGpu
from pytest_fla.targets import COMPILE_ONLY, EMULATED, INTERPRETER, NATIVE


def host(name, archs=(), stand_in=False, triton="3.6.0", torch="2.11.0+cu128", spec=None):
    gpus = tuple(HostGpu(str(i), arch, f"GPU {arch}") for i, arch in enumerate(archs))
    return Host(name, spec or f"ssh={name}//python=/venv/bin/python", name, gpus, stand_in, "570.86.15", torch,
                triton, "3.11.7", "/usr/local/cuda/bin/compute-sanitizer")


def worker_env(worker) -> dict:
    import execnet

    return execnet.XSpec(worker.spec).env


def test_each_gpu_runs_its_own_arch_once_per_arch_across_hosts():
    a100, h100 = host("a100-box", [80]), host("h100-box", [90, 90])
    plan = fleet.plan([a100, h100], extra=[], per_gpu=1)
    assert [(t.name, t.mode) for t in plan.targets] == [("sm80", NATIVE), ("sm90", NATIVE)]
    by_target = {t.name: [worker_env(w) for w in plan.workers_of(t)] for t in plan.targets}
    # one worker per GPU, each pinned; sm90's two workers each keep half of the tests
    assert [(e["FLA_FLEET_HOST"], e["CUDA_VISIBLE_DEVICES"], e.get("FLA_SHARD")) for e in by_target["sm90"]] == [
        ("h100-box", "0", "0/2"), ("h100-box", "1", "1/2")]
    assert [(e["CUDA_VISIBLE_DEVICES"], e.get("FLA_SHARD")) for e in by_target["sm80"]] == [("0", None)]
    assert all(w.spec.startswith(w_host.spec) for w, w_host in zip(plan.workers, [a100, h100, h100]))


def test_n_gives_workers_per_gpu_and_the_arch_group_shares_its_tests():
    plan = fleet.plan([host("a", [90]), host("b", [90])], extra=[], per_gpu=2)
    envs = [worker_env(w) for w in plan.workers]
    assert [(e["FLA_FLEET_HOST"], e["FLA_SHARD"]) for e in envs] == [("a", "0/4"), ("a", "1/4"), ("b", "2/4"),
                                                                     ("b", "3/4")]


def test_archs_no_host_has_run_emulated_where_a_host_can_else_compile_only():
    hosts = [host("a100-box", [80]), host("h100-box", [90])]
    plan = fleet.plan(hosts, extra=[86, 100, 90], per_gpu=1)
    modes = {t.name: t.mode for t in plan.targets}
    assert modes == {"sm80": NATIVE, "sm90": NATIVE, "sm86": EMULATED, "sm100": COMPILE_ONLY}
    (emulated,) = plan.workers_of(next(t for t in plan.targets if t.name == "sm86"))
    # the H100 runs sm86 code; the A100 is older than sm86
    assert (emulated.host, worker_env(emulated)["CUDA_VISIBLE_DEVICES"]) == ("h100-box", "0")
    (compiling,) = plan.workers_of(next(t for t in plan.targets if t.name == "sm100"))
    assert worker_env(compiling)["CUDA_VISIBLE_DEVICES"] == ""  # compile-only touches no GPU


def test_stand_ins_and_gpu_less_hosts_run_the_interpreter():
    plan = fleet.plan([host("cpu-box"), host("vm", [80], stand_in=True)], extra=[86], per_gpu=1)
    assert [(t.name, t.mode) for t in plan.targets] == [("interpreter", INTERPRETER), ("sm80", INTERPRETER),
                                                        ("sm86", COMPILE_ONLY)]  # a stand-in emulates nothing
    assert all(worker_env(w)["CUDA_VISIBLE_DEVICES"] == "" for w in plan.workers)
    with pytest.raises(ValueError, match="stand-in .* cannot share an arch with a real GPU"):
        fleet.plan([host("vm", [80], stand_in=True), host("a100-box", [80])], extra=[], per_gpu=1)


def test_a_socket_server_gets_one_worker():
    """execnet's socket server runs one gateway at a time: a second worker would wait for ever."""
    assert len(fleet.plan([host("a", [90], spec="socket=a:8888")], extra=[], per_gpu=1).workers) == 1
    with pytest.raises(ValueError, match="runs one gateway at a time: start a server per GPU"):
        fleet.plan([host("a", [90, 90], spec="socket=a:8888")], extra=[], per_gpu=1)


def test_hosts_are_named_by_hostname_numbered_where_gateways_share_one():
    answer = {"hostname": "box", "python": "3.11.7", "torch": "2.11.0", "triton": "3.6.0", "sanitizer": None,
              "driver": "570.86.15", "error": None, "stand_in": None,
              "gpus": [{"id": "1", "arch": 90, "name": "NVIDIA H100 80GB HBM3"}]}
    hosts = fleet.hosts_from_answers(["popen//env:CUDA_VISIBLE_DEVICES=0", "popen//env:CUDA_VISIBLE_DEVICES=1", "ssh=x"],
                                     [answer, answer, {**answer, "hostname": "x", "stand_in": "sm80,sm90x2"}])
    assert [h.name for h in hosts] == ["box#1", "box#2", "x"]
    assert [(g.id, g.arch) for g in hosts[2].gpus] == [("0", 80), ("1", 90), ("2", 90)]
    assert "1x NVIDIA H100 80GB HBM3 (sm90) [GPU 1]; driver 570.86.15, torch 2.11.0, Triton 3.6.0" in hosts[0].describe()
    with pytest.raises(ValueError, match="FLA_FLEET_STAND_IN='hopper'"):
        fleet.hosts_from_answers(["x"], [{**answer, "stand_in": "hopper"}])
    with pytest.raises(ValueError, match="torch cannot look for GPUs: RuntimeError: no driver"):
        fleet.hosts_from_answers(["x"], [{**answer, "error": "RuntimeError: no driver"}])


def test_version_disagreement_names_each_version_and_its_hosts():
    hosts = [host("a", [80]), host("b", [90], triton="3.9.0"), host("c", [90])]
    assert fleet.version_disagreement(hosts) == "Triton: 3.6.0 on a, c; 3.9.0 on b"
    assert fleet.version_disagreement(hosts[::2]) is None


def test_a_worker_spec_keeps_the_users_gateway_and_adds_the_workers_settings():
    from pytest_fla.running.distribute import with_env

    spec = with_env("ssh=gpu-a//id=mine//python=/v/bin/python", {"FLA_FLEET_HOST": "gpu-a", "X": ""})
    assert spec == "ssh=gpu-a//python=/v/bin/python//env:FLA_FLEET_HOST=gpu-a//env:X="


def test_the_host_probe_answers_on_this_machine():
    """The probe execnet sends each host, run here: the real one, without a stand-in."""
    from pytest_fla.running import fleet_probe

    facts = fleet_probe.probe("FLA_FLEET_STAND_IN_UNSET")
    assert facts["error"] is None and facts["stand_in"] is None
    assert facts["torch"] and facts["triton"] and facts["hostname"]
    assert len(facts["gpus"]) == (GPU.count if GPU else 0)


def test_a_cell_names_its_hosts_and_its_lost_tests():
    assert report.cell_text({"passed": 3, "failed": 0, "skipped": 1, "hosts": ["a", "b"]}) == "pass 3 +1 skip @a,b"
    assert report.cell_text({"passed": 1, "failed": 1, "skipped": 0, "lost": 2, "hosts": ["b"]}) == \
        "FAIL 1/4 LOST 2/4 @b"


PROJECT = '''
import os, pytest

@pytest.mark.parametrize("i", range(4))
@pytest.mark.fla_op("opa")
def test_forward(i):
    assert os.environ["TRITON_INTERPRET"] == "1"  # a stand-in runs no GPU
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    if os.environ.get("DIE_AT") == str(i):
        os._exit(3)  # the host goes down
'''

# compile checks run in their own arch's compile-capable worker only (sm80's stand-in runs
# the interpreter, which compiles nothing)
COMPILE_PROJECT = '''
import pytest

@pytest.mark.fla_op("opa")
@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.fla_compile(a)) for a in ("sm80", "sm100")])
def test_compile(arch):
    pass
'''

# docs/design.md's command ("Fleet"), with popen gateways standing in for two hosts.
STAND_INS = ["--tx", "popen//env:FLA_FLEET_STAND_IN=sm80", "--tx", "popen//env:FLA_FLEET_STAND_IN=sm90"]


def fleet_report(pytester, *args, gateways=STAND_INS):
    result = run(pytester, *gateways, "--fla-report=report.json", *args)
    path = pytester.path / "report.json"
    return result, (json.loads(path.read_text()) if path.exists() else None)


# pytest on a machine without torch, Triton or numpy (the CI recipe's controller)
CONTROLLER_WITHOUT_TORCH = '''
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in ("torch", "triton", "numpy"):
            raise ImportError(f"{name} is not installed on this controller")

sys.meta_path.insert(0, NotInstalled())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
'''


def test_each_arch_runs_on_its_own_gateway_into_one_matrix(pytester, monkeypatch):
    pytester.makepyfile(test_numeric=PROJECT, test_compiles=COMPILE_PROJECT)
    (pytester.path / "controller.py").write_text(CONTROLLER_WITHOUT_TORCH)
    # only this plugin and xdist: a machine's other pytest plugins may import numpy (jaxtyping
    # does, on the GPU machine), which this controller lacks
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    result = pytester.run(sys.executable, "controller.py", "-p", "xdist.plugin", "-p", "pytest_fla.plugin",
                          "-p", "no:cacheprovider", "-p", "no:randomly", *STAND_INS,
                          "--fla-arch=fleet,sm100", "--fla-report=report.json", "test_numeric.py", "test_compiles.py",
                          timeout=540)
    data = json.loads((pytester.path / "report.json").read_text())
    out = result.stdout.str()
    assert result.ret == 0, out
    host1, host2 = (h["name"] for h in data["hosts"])
    assert [h["gpus"][0]["arch"] for h in data["hosts"]] == ["sm80", "sm90"]
    assert all(h["triton"] and h["torch"] for h in data["hosts"])
    assert {a["name"]: a["mode"] for a in data["archs"]} == {"sm80": INTERPRETER, "sm90": INTERPRETER,
                                                             "sm100": COMPILE_ONLY}
    # every numeric test once per arch, on that arch's host; the compile check on sm100's worker only
    assert data["matrix"]["sm80"]["opa"]["forward"] == {"passed": 4, "failed": 0, "skipped": 0, "hosts": [host1]}
    assert data["matrix"]["sm90"]["opa"]["forward"] == {"passed": 4, "failed": 0, "skipped": 0, "hosts": [host2]}
    assert data["matrix"]["sm100"]["opa"]["compile"]["passed"] == 1
    assert "compile" not in data["matrix"]["sm80"]["opa"]
    assert f"opa  pass 4 @{host1}" in out and f"opa  pass 4 @{host2}" in out
    assert f"fla fleet: 2 hosts, 2 GPUs, 3 xdist workers" in out
    assert "sm90: interpreter - stand-in hosts (FLA_FLEET_STAND_IN)" in out


def python_with_triton(tmp_path, version: str) -> str:
    """A Python whose installed Triton says ``version`` (package metadata first on its
    path): a host with another Triton, as the probe sees one."""
    site = tmp_path / "other-triton"
    info = site / f"triton-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: triton\nVersion: {version}\n")
    wrapper = tmp_path / "python-other-triton"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site}:$PYTHONPATH exec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return str(wrapper)


def test_hosts_on_other_versions_stop_the_run_before_any_test(pytester, tmp_path):
    pytester.makepyfile(test_numeric=PROJECT)
    other = python_with_triton(tmp_path, "3.99.0")
    args = ["--tx", "popen//env:FLA_FLEET_STAND_IN=sm80", "--tx", f"popen//python={other}//env:FLA_FLEET_STAND_IN=sm90",
            "--fla-arch=fleet"]
    result = run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    # the first host runs this process's Triton, whichever of the range it is
    here = importlib.metadata.version("triton")
    assert "the hosts run different versions" in err and f"Triton: {here} on " in err and "3.99.0 on " in err, err
    assert "--fla-fleet-mixed-versions" in err
    assert "test session starts" not in result.stdout.str()
    allowed = run(pytester, *args, "--fla-fleet-mixed-versions")
    allowed.assert_outcomes(passed=8)
    assert "Triton 3.99.0" in allowed.stdout.str()  # the header says which host runs which


def test_a_host_lacking_compute_sanitizer_stops_a_sanitizer_run(pytester, tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    tool = tools / "compute-sanitizer"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    pytester.makepyfile(test_numeric=PROJECT)
    # the second host's PATH without the directories that hold the real tool (a GPU machine's)
    bare = ":".join(d for d in os.environ["PATH"].split(":") if d and not os.path.exists(os.path.join(d, tool.name)))
    result = run(pytester, "--tx", f"popen//env:FLA_FLEET_STAND_IN=sm80//env:PATH={tools}:{os.environ['PATH']}",
                 "--tx", f"popen//env:FLA_FLEET_STAND_IN=sm90//env:PATH={bare}", "--fla-arch=fleet",
                 "--fla-sanitizer=memcheck")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "compute-sanitizer is not on the PATH of " in err and err.count("#") == 1, err  # only the second host


def test_a_host_that_goes_down_loses_only_its_own_tests(pytester):
    pytester.makepyfile(test_numeric=PROJECT)
    result = run(pytester, STAND_INS[0], STAND_INS[1], STAND_INS[2], STAND_INS[3] + "//env:DIE_AT=1",
                 "--fla-arch=fleet", "--fla-report=report.json")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    data = json.loads((pytester.path / "report.json").read_text())
    host1, host2 = (h["name"] for h in data["hosts"])
    assert data["matrix"]["sm80"]["opa"]["forward"] == {"passed": 4, "failed": 0, "skipped": 0, "hosts": [host1]}
    assert data["matrix"]["sm90"]["opa"]["forward"] == {"passed": 1, "failed": 1, "skipped": 0, "lost": 2,
                                                        "hosts": [host2], "verdicts": {"defect": 1}}
    outcome = {t["nodeid"].split("[")[1][0]: (t["outcome"], t["reason"]) for t in data["tests"] if t["arch"] == "sm90"}
    assert outcome["1"][0] == "failed" and "crashed while running" in outcome["1"][1]
    assert [outcome[i][0] for i in "23"] == ["lost", "lost"]
    assert f"on {host2} went down" in outcome["2"][1]
    assert f"sm90: 2 tests not run: worker gw1 on {host2} went down" in out
    assert "worker gw1 crashed and worker restarting disabled" in out  # the fleet's --max-worker-restart=0


def test_isolation_runs_in_the_remote_workers_children(pytester):
    """--fla-isolate on a fleet: each worker's children run its tests under its target and
    host; a crash there fails only its test, and the host goes on."""
    pytester.makepyfile(test_numeric=textwrap.dedent('''
        import os, pytest

        @pytest.mark.parametrize("i", range(2))
        @pytest.mark.fla_op("opa")
        def test_forward(i):
            assert os.environ["TRITON_INTERPRET"] == "1" and os.environ["FLA_FLEET_HOST"]
            if os.environ.get("DIE_AT") == str(i):
                os._exit(3)
    '''))
    result = run(pytester, STAND_INS[0], STAND_INS[1], STAND_INS[2], STAND_INS[3] + "//env:DIE_AT=0",
                 "--fla-arch=fleet", "--fla-isolate=test", "--fla-report=report.json")
    data = json.loads((pytester.path / "report.json").read_text())
    host1, host2 = (h["name"] for h in data["hosts"])
    assert data["matrix"]["sm80"]["opa"]["forward"] == {"passed": 2, "failed": 0, "skipped": 0, "hosts": [host1]}
    assert data["matrix"]["sm90"]["opa"]["forward"] == {"passed": 1, "failed": 1, "skipped": 0, "hosts": [host2],
                                                        "verdicts": {"defect": 1}}
    failed = next(t for t in data["tests"] if t["outcome"] == "failed")
    assert "exited with code 3" in failed["reason"] and failed["process_seconds"] is not None
    assert "crashed" not in result.stdout.str()  # the worker itself did not


@pytest.mark.skipif(GPU is None or GPU.count < 2, reason="needs two GPUs: one gateway pinned to each")
def test_two_gpus_two_gateways(pytester):
    """On a machine with two GPUs: two popen gateways, each pinned to one GPU, run the
    native arch's tests between them, once each, and the matrix names each cell's hosts."""
    pytester.makepyfile(test_gpu=textwrap.dedent('''
        import pytest, torch

        @pytest.mark.parametrize("i", range(8))
        @pytest.mark.fla_op("opa")
        def test_forward(i):
            assert torch.cuda.device_count() == 1  # pinned
            x = torch.arange(1024, device="cuda", dtype=torch.float32)
            assert float((x * 2).sum()) == 1024 * 1023
    '''))
    result = run(pytester, "--tx", "popen//env:CUDA_VISIBLE_DEVICES=0", "--tx", "popen//env:CUDA_VISIBLE_DEVICES=1",
                 "--fla-arch=fleet", "--fla-report=report.json")
    data = json.loads((pytester.path / "report.json").read_text())
    print("\n".join(line for line in result.stdout.lines if "fla fleet" in line or line.startswith("  ")))
    assert result.ret == 0, result.stdout.str()
    (arch,) = data["matrix"]
    assert data["matrix"][arch]["opa"]["forward"]["passed"] == 8
    tests = [t for t in data["tests"] if t["arch"] == arch]
    assert sorted({(t["host"], t["gpu"]) for t in tests}) == sorted(
        (h["name"], h["gpus"][0]["id"]) for h in data["hosts"])  # each host ran its share, on its own GPU
    assert len(data["hosts"]) == 2 and {t["gpu"] for t in tests} == {"0", "1"}


def test_hosts_with_checkouts_of_their_own_run_their_testpaths(pytester, tmp_path):
    """docs/design.md's ssh recipe (``ssh=HOST//python=DIR/.venv/bin/python//chdir=DIR``, no test
    paths), with popen gateways in checkouts of their own standing in for the hosts."""
    pytester.makepyfile(test_numeric=PROJECT)
    (pytester.path / "pytest.ini").write_text("[pytest]\ntestpaths = .\n")
    gateways = []
    for name, arch in (("host-a", "sm80"), ("host-b", "sm90")):
        checkout = tmp_path / name
        checkout.mkdir()
        for path in ("test_numeric.py", "pytest.ini"):
            (checkout / path).write_text((pytester.path / path).read_text())
        gateways += ["--tx", f"popen//python={sys.executable}//chdir={checkout}//env:FLA_FLEET_STAND_IN={arch}"]
    refused = run(pytester, *gateways, "--fla-arch=fleet", "test_numeric.py")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    assert "give no test paths (test_numeric.py)" in refused.stderr.str()
    (pytester.path / "test_numeric.py").unlink()  # the hosts' checkouts have the tests, the controller none
    result, data = fleet_report(pytester, "--fla-arch=fleet", gateways=gateways)
    assert result.ret == 0, result.stdout.str()
    assert {arch: cells["opa"]["forward"]["passed"] for arch, cells in data["matrix"].items()} == {"sm80": 4, "sm90": 4}


def test_the_sanitizer_runs_in_every_hosts_workers(pytester, monkeypatch):
    """--fla-sanitizer on a fleet, with test_sanitizer_flow's stand-in compute-sanitizer on
    the hosts' PATH: each host re-runs its tests under the tool, and a finding fails the
    test on the host that found it."""
    from test_sanitizer_flow import PROJECT as KERNELS
    from test_sanitizer_flow import _stand_in

    log = _stand_in(pytester, monkeypatch)
    pytester.makepyfile(test_kernels=KERNELS.split("def test_fails_plainly")[0])
    # a finding file per host: the stand-in takes the one its test leaves, and the hosts run at once
    gateways = [arg if arg == "--tx" else f"{arg}//env:FAKE_SANITIZER_FINDING={pytester.path}/finding-{arg[-4:]}"
                for arg in STAND_INS]
    result, data = fleet_report(pytester, "--fla-arch=fleet", "--fla-sanitizer=memcheck", gateways=gateways)
    out = result.stdout.str()
    host1, host2 = (h["name"] for h in data["hosts"])
    tests = {(t["arch"], t["nodeid"].split("::")[1]): t for t in data["tests"]}
    for arch, host_name in (("sm80", host1), ("sm90", host2)):
        assert tests[(arch, "test_clean")]["outcome"] == "passed"
        finding = tests[(arch, "test_reads_past_the_end")]
        assert finding["outcome"] == "failed" and finding["host"] == host_name
        assert finding["sanitizer_seconds"]
    assert out.count("Invalid __global__ read of size 4 bytes") >= 2
    assert log.read_text().splitlines() == ["memcheck 1 1"] * 4  # two tests under the tool on each host


def test_a_host_that_goes_down_before_the_tests_start_fails_the_run(pytester):
    """xdist hands the tests out once every worker has collected; a worker gone before that
    stops the run with nothing run, which must not pass."""
    pytester.makepyfile(test_numeric=PROJECT)
    pytester.makeconftest('''
        import os

        def pytest_collection_modifyitems(items):
            if os.environ.get("DIE_IN_COLLECTION"):
                os._exit(3)
    ''')
    result = run(pytester, STAND_INS[0], STAND_INS[1], STAND_INS[2], STAND_INS[3] + "//env:DIE_IN_COLLECTION=1",
                 "--fla-arch=fleet")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["fla fleet: worker gw1 on * went down before the tests were handed out (*): "
                                 "xdist stopped the run"])


def test_the_ci_job_drives_the_hosts_it_is_given(tmp_path):
    """ci/fleet_job.sh as ci/fleet_workflow.yml runs it, given popen gateways standing in for
    the ssh hosts, on a small selection of this repository's suite."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHON=sys.executable, FLA_SELECT="--fla-ops=l2norm", FLA_FLEET_ARCH="fleet",
               FLA_FLEET_TX=" ".join(STAND_INS[1::2]), PYTHONPATH=str(root))
    report_path = tmp_path / "report.json"
    job = subprocess.run(["bash", "ci/fleet_job.sh", "tests/test_conformance.py", "-k", "forward and fp32",
                          f"--fla-report={report_path}", f"--junitxml={tmp_path / 'junit.xml'}"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=540)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    data = json.loads(report_path.read_text())
    cells = {arch: ops["l2norm"]["forward"] for arch, ops in data["matrix"].items()}
    assert set(cells) == {"sm80", "sm90"} and all(c["passed"] and not c["failed"] for c in cells.values())
    assert [len(c["hosts"]) for c in cells.values()] == [1, 1] and cells["sm80"]["hosts"] != cells["sm90"]["hosts"]
    assert all(t["process_seconds"] is not None for t in data["tests"])  # the job's --fla-isolate=module children
