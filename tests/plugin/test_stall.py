"""pytest_fla.running.stall on real processes: a tree that sleeps is stalled, one that computes or
writes its progress file is not."""

from __future__ import annotations

import subprocess
import sys
import time

from pytest_fla.running import stall

def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_a_sleeping_tree_is_killed_with_where_it_waited(tmp_path):
    # the sleeper is a grandchild: the whole tree is watched and killed
    process = _start("import subprocess, sys; subprocess.call([sys.executable, '-c', 'import time; time.sleep(60)'])")
    start = time.monotonic()
    found = stall.wait(process, tmp_path / "progress", seconds=2)
    assert time.monotonic() - start < 20
    assert found.startswith("no progress for 2 s")
    assert found.count("state sleeping") >= 2 and "time.sleep(60)" in found
    assert process.returncode is not None


def test_computing_or_writing_progress_is_not_a_stall(tmp_path):
    # a window of 4 s asks for a quarter of a core: room for a loaded CI machine
    busy = _start("import time\nend = time.time() + 8\nwhile time.time() < end: pass")
    assert stall.wait(busy, tmp_path / "progress", seconds=4) is None and busy.returncode == 0
    progress = tmp_path / "progress"
    writing = _start(f"import time\nfor i in range(6):\n    open({str(progress)!r}, 'a').write('x')\n    time.sleep(1)")
    assert stall.wait(writing, progress, seconds=2.5) is None and writing.returncode == 0


def test_without_a_limit_it_only_waits(tmp_path):
    process = _start("import time; time.sleep(3)")
    assert stall.wait(process, tmp_path / "progress", seconds=None) is None and process.returncode == 0
