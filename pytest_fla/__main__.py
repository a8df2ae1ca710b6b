"""``python -m pytest_fla new-repro NAME``: scaffold a reproducer in tests/repro/.

``run-repro`` is what the plugin runs in a fresh process for each reproducer.
``mutate`` plants one bug at a time in an op's kernels and scores its checks
(:mod:`pytest_fla.mutation`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import repro


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_fla")
    commands = parser.add_subparsers(dest="command", required=True)
    new = commands.add_parser("new-repro", help="write a reproducer scaffold to fill in")
    new.add_argument("name", help="file name without .py, e.g. bh_over_65535")
    new.add_argument("--dir", default="tests/repro", type=Path, help="where reproducers live (default tests/repro)")
    new.add_argument("--source", default="<link to the report>", help="where the report came from")
    new.add_argument("--seen-on", default="sm90", help="the arch the user saw it on")
    new.add_argument("--expect", default="pass", help="`pass` or `raises ValueError: <regex>`")
    new.add_argument("--op", default="<op name, e.g. chunk_simple_gla>", help="the op the report is about")
    run = commands.add_parser("run-repro", help="run one reproducer here and compare with its expectation")
    run.add_argument("path")
    run.add_argument("--expect", required=True)
    mutate = commands.add_parser("mutate", help="plant one bug at a time in each op's kernels, score its checks")
    from .mutation import command as mutation

    mutation.add_arguments(mutate)
    args = parser.parse_args(argv)
    if args.command == "mutate":
        args.argv = list(sys.argv[1:] if argv is None else argv)
        return mutation.run(args)
    if args.command == "new-repro":
        try:
            path = repro.new_repro(args.name, args.dir, args.source, args.seen_on, args.expect, args.op)
        except (ValueError, FileExistsError) as error:
            print(f"new-repro: {error}", file=sys.stderr)
            return 2
        print(f"wrote {path}: fill in the header and paste the user's code")
        return 0
    return repro.run_repro(args.path, args.expect)


if __name__ == "__main__":
    sys.exit(main())
