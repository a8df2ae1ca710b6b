"""ci/cpu_job.sh as ci/workflow.yml runs it, on a small selection of this repository's suite:
bf16 checked under the emulated arithmetic, then the example package from its own folder.

The example runs here with its numeric checks only (``--fla-arch=native`` after the job's
``--fla-arch=all``): what this test holds is that the job runs it after the selection, through
the editable install. Its kernels compiled for every arch are ``ci/wheel_example.sh``'s run of
the same command in the same CI (``ci/test.sh``), and the workflow's job runs them itself: here
they took 50 of the test's 120 s (2 cores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


def test_the_cpu_job_checks_bf16_and_runs_the_example(tmp_path):
    env = dict(os.environ, FLA_SELECT="--fla-ops=l2norm", FLA_EXAMPLE_ARGS="--fla-arch=native", PYTHONPATH=str(ROOT))
    if (ROOT / ".venv" / "bin" / "python").exists():
        env.pop("PYTHON", None)  # the job's own default, as the workflow leaves it
    else:
        env["PYTHON"] = sys.executable
    job = subprocess.run(["bash", "ci/cpu_job.sh", "tests/test_conformance.py", "-k", "test_forward and bf16", "-rs",
                          f"--fla-report={tmp_path / 'report.json'}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-4000:]
    # the bf16 checks ran under the interpreter instead of skipping as raw-bit products
    assert "raw bits" not in out, out[-4000:]
    summaries = [line for line in job.stdout.splitlines() if " passed" in line and " in " in line]
    assert len(summaries) == 2, out[-4000:]  # the selection's, then the example package's
    assert (tmp_path / "report.json").exists()
