"""Subcommands of ``pagedkv`` for this package (see ``pagedkv.cli.COMMAND_MODULES``): ``report``.

Nothing heavy is imported until a command runs (matplotlib only for ``--block-map``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pagedkv.io import path_arg


def _cmd_report(args: argparse.Namespace) -> int:
    from pagedkv.exits import require

    if args.block_map:
        require("matplotlib")
    from pagedkv.errors import PagedKVError
    from pagedkv.io import check_output_dir, check_output_file, is_stdout
    from pagedkv.report.html import build_report

    results = Path(args.dir)
    if results.exists() and not results.is_dir():
        raise PagedKVError(f"no results in {results}: it is not a directory")
    if args.out:
        check_output_file("--out", args.out)
    else:
        check_output_file("DIR", results / "report.html")
    if args.block_map:
        check_output_dir("--block-map", results / "block-map", ("results.json", "results.csv"))
        from pagedkv.report.block_map import run_block_map

        run_block_map(results / "block-map", quick=args.quick)
    out = build_report(results, Path(args.out) if args.out else None)
    if not is_stdout(out):  # the page itself went there
        print(out)
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this package's subcommands to the ``pagedkv`` parser."""
    report = sub.add_parser(
        "report",
        allow_abbrev=False,
        help="Build one self-contained HTML page of every experiment's results and the claims.",
        description="Build one self-contained HTML page (images embedded, works offline) from "
        "every directory under DIR holding a results.json, and the claims table of "
        "DIR/claims/claims.json; print its path. Exit code 2 if DIR holds no results.",
    )
    report.add_argument(
        "dir",
        nargs="?",
        default="results",
        metavar="DIR",
        help="The results directory (default: results).",
    )
    report.add_argument(
        "--out",
        type=path_arg,
        metavar="PATH",
        help="Write the page here (default: DIR/report.html; - for standard output).",
    )
    report.add_argument(
        "--block-map",
        action="store_true",
        help="First draw the block map into DIR/block-map (a few seconds; needs matplotlib).",
    )
    report.add_argument(
        "--quick", action="store_true", help="With --block-map: the lesson's run only."
    )
    report.set_defaults(func=_cmd_report)
