"""Puts this environment's torch, with the packages it requires, into another environment
as hard links (copies where the two are on different disks), so that the other's
``pip install torch==...`` finds it installed instead of unpacking the same wheel again
(about 30 s and 1 GB of the CPU CI's second and third environments, 2 cores).

    .venv/bin/python ci/share_torch.py DEST_SITE_PACKAGES

Run by the source environment's Python. Each distribution's files are those its RECORD
lists inside site-packages (no scripts); a distribution the destination already has (its
own pip, setuptools) is left to the destination's pip, which upgrades it if torch needs a
newer one. The links are safe to share: pip replaces or removes files, never writes into
one, so an upgrade in either environment leaves the other's files as they were.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import shutil
import sys

ROOT = "torch"


def closure(name: str) -> list[metadata.Distribution]:
    """``name``'s distribution and those its requirements (without extras) name, recursively."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        try:
            dist = metadata.distribution(key)
        except metadata.PackageNotFoundError:
            continue  # a requirement not installed here: the destination's pip installs it
        seen[key] = dist
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            todo.append(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0))
    return list(seen.values())


def installed_names(site: str) -> set[str]:
    return {re.sub(r"[-_.]+", "-", entry.split("-")[0]).lower()
            for entry in os.listdir(site) if entry.endswith(".dist-info")}


def main() -> int:
    dest = os.path.abspath(sys.argv[1])
    present = installed_names(dest)
    linked = 0
    for dist in closure(ROOT):
        if re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower() in present:
            continue
        base = os.path.abspath(str(dist.locate_file("")))
        for path in dist.files or []:
            source = os.path.abspath(str(dist.locate_file(path)))
            if not source.startswith(base + os.sep) or not os.path.isfile(source) or "__pycache__" in source:
                continue
            target = os.path.join(dest, os.path.relpath(source, base))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.exists(target):
                os.unlink(target)
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
            linked += 1
    print(f"share_torch: {linked} files of {ROOT} and its requirements into {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
