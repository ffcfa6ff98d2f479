"""The ``pagedkv`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from pagedkv import __version__
from pagedkv.errors import PagedKVError


def _cmd_bench(args: argparse.Namespace) -> int:
    from pagedkv.experiments.lesson_capacity import lesson_capacity
    from pagedkv.io import atomic_write_json
    from pagedkv.report.tables import lesson_capacity_summary, lesson_capacity_table

    result = lesson_capacity()
    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=120)
    console.print(lesson_capacity_table(result))
    for line in lesson_capacity_summary(result):
        console.print(line, soft_wrap=True)
    if args.json:
        atomic_write_json(args.json, result.to_dict())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagedkv",
        description="PagedAttention's memory manager and the lab bench to study it.",
    )
    parser.add_argument("--version", action="version", version=f"pagedkv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser(
        "bench",
        help="The main benchmark: the course lesson's workload, paged against contiguous.",
        description="What each allocator must hold for the course lesson's 20 requests.",
    )
    bench.add_argument("--json", metavar="PATH", help="Also write the table as JSON (atomically).")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except PagedKVError as exc:
        print(f"pagedkv: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
