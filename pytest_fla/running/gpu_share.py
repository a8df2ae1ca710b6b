"""Sharing one GPU between the processes that test on it (xdist workers, isolated children).

Most checks need a few GB and run side by side. A few need tens of GB (a batch of 2**31
elements; a B*H > 65535 batch with its float64 reference), and next to other workers'
checks they can run the card out of memory (16 workers on an 80 GB H100 did, with 15-23 GB
processes among them). So every check holds its GPU's lock shared, and those few hold it
alone.

A process waiting to hold it alone goes first (it takes a turnstile that new shared
holders must pass), or a steady stream of shared holders could keep it waiting until the
run's end. Locks are ``flock`` on files in the temp directory, named by the physical GPU,
so they work across unrelated processes and vanish with them.

A patient exclusive holder (``alone(patient=True)``) takes no turnstile: it waits until no
shared holder is left, letting later ones go first. Every process waiting to be alone, or
holding it so, says so on a flag file (a shared ``flock`` on it), patient or not: that is
what the others look for before they give their memory back. The plugin makes a check patient
where nothing but such checks follows it in its process (``large_memory`` checks run
last): draining the other workers for it would only idle them, while waiting costs its
worker nothing. In a cold run on the H100 the 26 2**31-element checks, each draining the
other workers in turn (a compile in flight lasts tens of seconds), kept 4-8 of 16 workers
waiting from 246 s to the end of a 555 s run.

A process that gives way to an exclusive holder (it leaves a shared hold, or waits for
one, while another waits to be alone or is alone; or it is about to wait to be alone
itself) first returns what it holds unused
(``gpu_memory.return_to_device``): its allocator's cached memory (on the H100 the
2**31-element checks had found 47-49 of 79 GiB free when alone, the rest cached by the 15
other workers) and the local memory its spilling kernels grew, which ``empty_cache``
leaves: with the caches returned the checks still found only 48 GiB free, and a worker
that once ran one of the spilling fp32 kernels keeps up to 2.4 GiB of it (by the stack
frames of their sm90 cubins). With that in place, amid a warm suite the checks found 52-63
GiB free and the other 15 processes holding 15-27 GiB: the patient holders were not yet on
the flag file, so the workers beside them, and the waiting holders themselves, seldom gave
anything back.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from typing import Callable

_SHARES: dict[str, "GpuShare"] = {}


class GpuShare:
    """``release``: called where this process gives way to an exclusive holder, and before
    it waits to hold the GPU alone (``for_device`` passes ``gpu_memory.return_to_device``)."""

    def __init__(self, name: str, directory: str | None = None, release: Callable[[], None] | None = None):
        base = os.path.join(directory or tempfile.gettempdir(), f"pytest-fla-gpu-{name}")
        self._lock = open(base + ".lock", "a")
        self._turnstile = open(base + ".turnstile", "a")
        # held shared while this process waits to be alone or is; probed through a second
        # open file, since flock converts a lock taken again through the same one
        self._wants_alone = open(base + ".alone", "a")
        self._alone_probe = open(base + ".alone", "a")
        self._release = release or (lambda: None)
        self._shared_depth = 0
        self._alone = False

    def _exclusive_waiting(self) -> bool:
        """Whether another process waits to be alone or is alone (patient or not; or, for an
        instant, probes the flag as this one does, which costs one needless release)."""
        try:
            fcntl.flock(self._alone_probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._alone_probe, fcntl.LOCK_UN)
        return False

    @contextlib.contextmanager
    def shared(self):
        """Run beside other shared holders; wait while anyone holds (or waits for) it alone."""
        if self._shared_depth or self._alone:
            self._shared_depth += 1
            try:
                yield
            finally:
                self._shared_depth -= 1
            return
        if self._exclusive_waiting():
            self._release()
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        fcntl.flock(self._lock, fcntl.LOCK_SH)
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        self._shared_depth = 1
        try:
            yield
        finally:
            self._shared_depth = 0
            if self._exclusive_waiting():
                self._release()
            fcntl.flock(self._lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def alone(self, patient: bool = False):
        """Run with no other holder. Inside ``shared()`` the shared hold is given up first:
        two processes each keeping theirs while waiting for the other's would deadlock.
        ``patient``: wait for the shared holders to be gone on their own, later ones
        included, instead of going before them. Its own memory goes back before it waits:
        unused while it waits, it would count against a holder that goes first, and what
        it reads once alone is then all there is."""
        if self._alone:  # nested: already alone
            yield
            return
        fcntl.flock(self._wants_alone, fcntl.LOCK_SH)
        was_shared = self._shared_depth > 0
        if was_shared:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._release()
        if not patient:
            fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # flock grants shared holds past a waiting one
        self._alone = True
        try:
            yield
        finally:
            self._alone = False
            # back to shared while still holding the turnstile (unless patient), so no one slips in between
            fcntl.flock(self._lock, fcntl.LOCK_SH if was_shared else fcntl.LOCK_UN)
            if not patient:
                fcntl.flock(self._turnstile, fcntl.LOCK_UN)
            fcntl.flock(self._wants_alone, fcntl.LOCK_UN)


def physical_gpu(index: int) -> str:
    """The GPU behind CUDA device ``index`` of this process, as CUDA_VISIBLE_DEVICES names
    it: workers pinned to different GPUs must not share a lock."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[index] if index < len(visible) else str(index)


def for_device(device) -> GpuShare:
    """The share of ``device`` (a torch CUDA device), one per GPU per process."""
    name = physical_gpu(device.index or 0)
    if name not in _SHARES:
        from .gpu_memory import return_to_device

        _SHARES[name] = GpuShare(name, release=lambda: return_to_device(device))
    return _SHARES[name]


# Whether this process's next exclusive hold may be patient (``GpuShare.alone``): set for
# each test by the plugin (``set_patient``), from what its process runs after it.
_patient = False


def set_patient(patient: bool) -> None:
    """Before each test: whether its exclusive holds are patient."""
    global _patient
    _patient = patient


def alone_on(device):
    """This process alone on ``device``'s GPU (other workers' checks wait): for the checks
    that need a large part of its memory (a 2**31-element batch). Taking it waits for every
    check in flight to end, which idles the rest of the GPU meanwhile (unless patient: then
    it waits for the others to run out of checks): hold it only to run."""
    import torch

    return for_device(torch.device(device)).alone(patient=_patient)
