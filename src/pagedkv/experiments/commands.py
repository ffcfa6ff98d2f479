"""Subcommands of ``pagedkv`` for this package (see ``pagedkv.cli.COMMAND_MODULES``):
``experiment NAME``, ``claims`` and ``reproduce``. Nothing heavy is imported until a command
runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pagedkv.exits import require
from pagedkv.io import check_output_dir, path_arg
from pagedkv.sweep.commands import add_clock_flags

RESULT_FILES = ("results.json", "results.csv")
"""What every experiment writes in its directory (beside its plots)."""

NAMES = (  # help text only (the registry, which imports every experiment, is the authority)
    "lesson",
    "fragmentation",
    "block-size",
    "memory-pressure",
    "rate-latency",
    "preemption",
    "prefix-sharing",
    "shared-prefix",
    "chat",
    "eviction",
    "sampling",
)
"""For the help text only; the registry (``registry.EXPERIMENTS``) is the truth."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {text!r}; must be an integer >= 1")
    return value


def _seeds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 3:
        raise argparse.ArgumentTypeError(
            f"got {text!r}; must be an integer >= 3 (an interval needs three seeds)"
        )
    return value


def _common(p: argparse.ArgumentParser, out_help: str) -> None:
    p.add_argument("--quick", action="store_true", help="Fewer requests, 3 seeds, fewer points.")
    p.add_argument("--out", type=path_arg, metavar="DIR", help=out_help)
    p.add_argument(
        "--workers",
        type=_positive,
        metavar="N",
        help="Processes running configurations in parallel (default: every core).",
    )


def _cmd_experiment(args: argparse.Namespace) -> int:
    require("matplotlib", "scipy")  # plots and intervals: pagedkv[plot]
    from pagedkv.experiments import framework
    from pagedkv.experiments.registry import get_experiment

    module = get_experiment(args.name)  # a bad name is a ConfigError: exit 2
    out = Path(args.out) if args.out else Path("results") / args.name
    check_output_dir("--out", out, RESULT_FILES)
    result = framework.run_experiment(
        module,
        quick=args.quick,
        seeds=args.seeds,
        out=out,
        workers=args.workers,
        cost_model=args.cost_model,
        profile=args.profile,
    )
    print(f"{result.title}: {len(result.rows)} runs")
    for line in result.findings:
        print(f"  {line}")
    print(f"Wrote {out / 'results.json'}, results.csv and {len(result.plots)} plots")
    return 0


def _cmd_claims(args: argparse.Namespace) -> int:
    require("matplotlib", "scipy")
    from pagedkv.experiments.claims import run_claims

    out = Path(args.out) if args.out else Path("results")
    check_output_dir("--out", out)
    check_output_dir("--out", out / "claims", ("claims.json", "claims.csv"))
    for c in run_claims(out, quick=args.quick, workers=args.workers):
        print(f"{c.verdict:>13}  {c.id} (claimed {c.claimed}): {c.judged}")
    print(f"Wrote {out / 'claims' / 'claims.json'} and claims.csv")
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    require("matplotlib", "scipy")
    from pagedkv.experiments.reproduce import reproduce

    out = Path(args.out or "results")
    check_output_dir("--out", out, ("report.html", "timings.json"))
    reproduce(out, quick=args.quick, workers=args.workers)
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this package's subcommands to the ``pagedkv`` parser."""
    exp = sub.add_parser(
        "experiment",
        allow_abbrev=False,
        help="Run one experiment (seeds, 95%% intervals, plots): " + ", ".join(NAMES) + ".",
        description="Run one experiment: every configuration x seed in parallel processes; "
        "write results.json, results.csv and PNG plots (atomically).",
    )
    exp.add_argument("name", metavar="NAME", help="One of: " + ", ".join(NAMES) + ".")
    exp.add_argument(
        "--seeds", type=_seeds, metavar="N", help="Seeds 0..N-1 (default 5; 3 with --quick)."
    )
    _common(exp, "Results directory (default: results/NAME).")
    add_clock_flags(exp)
    exp.set_defaults(func=_cmd_experiment)
    claims = sub.add_parser(
        "claims",
        allow_abbrev=False,
        help="Judge the seed simulator's and the vLLM paper's claims from the experiments.",
        description="Measure each claim from the experiments' results under --out (running "
        "the missing ones), and compute its verdict; write OUT/claims/claims.json and .csv.",
    )
    _common(claims, "Results directory read and written (default: results).")
    claims.set_defaults(func=_cmd_claims)
    rep = sub.add_parser(
        "reproduce",
        allow_abbrev=False,
        help="Run every experiment, the block map, the claims and the HTML report.",
        description="Run every experiment, the block map, the claims and the HTML report "
        "into one results directory.",
    )
    _common(rep, "Results directory (default: results).")
    rep.set_defaults(func=_cmd_reproduce)
