"""What a fleet host has, asked through its xdist gateway before the session (``fleet.py``).

execnet sends this module's source to the host and runs it there, so it imports nothing
of pytest-fla (the host may not have it yet: ``--rsyncdir`` copies it later). It receives
the name of the stand-in variable and sends back a dict: hostname, Python, torch and
Triton versions (package metadata), compute-sanitizer's path, the NVIDIA driver, and each
GPU torch.cuda sees (its ``CUDA_VISIBLE_DEVICES`` name, arch, device name); or, where the
stand-in variable is set, its value in place of the GPUs.
"""

import os
import platform
import shutil
import socket
from importlib import metadata


def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def driver_version():
    """The kernel module's version (``570.86.15``), or None without an NVIDIA driver."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            words = f.readline().split()
    except OSError:
        return None
    return next((w for w in words if w[:1].isdigit() and "." in w), None)


def gpus():
    """Each GPU torch sees: what the suite there will run on. Raises where torch cannot start."""
    import torch

    if not torch.cuda.is_available():
        return [], None
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    found = []
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        found.append({"id": visible[index] if index < len(visible) else str(index),
                      "arch": major * 10 + minor, "name": torch.cuda.get_device_name(index)})
    return found, torch.version.cuda


def probe(stand_in_env):
    facts = {"hostname": socket.gethostname(), "python": platform.python_version(), "torch": version("torch"),
             "triton": version("triton"), "sanitizer": shutil.which("compute-sanitizer"),
             "stand_in": os.environ.get(stand_in_env) or None, "gpus": [], "driver": None, "error": None}
    if facts["stand_in"]:
        return facts
    facts["driver"] = driver_version()
    try:
        facts["gpus"], cuda = gpus()
    except Exception as error:  # reported with the host: a torch that cannot start is the answer
        facts["error"] = f"{type(error).__name__}: {error}"
    else:
        if facts["driver"] and cuda:
            facts["driver"] += f" (torch's CUDA {cuda})"
    return facts


if __name__ == "__channelexec__":
    channel.send(probe(channel.receive()))  # noqa: F821 - execnet's channel
