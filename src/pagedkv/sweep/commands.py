"""Subcommands of ``pagedkv`` for this package (see ``pagedkv.cli.COMMAND_MODULES``):
``sweep`` and ``plan``. Nothing heavy (ray, matplotlib, pyarrow) is imported until one runs."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from pagedkv.exits import EXIT_INTERRUPTED
from pagedkv.io import check_output_dir, path_arg

SWEEP_EPILOG = """\
The spec is YAML: any `pagedkv simulate` option as a top-level key (fixed for every point),
`grid:` (option: [values], every combination), `zip:` (option: [values], lists side by side)
and `seeds:` (a count or a list). The whole spec is checked before any point runs.

Results: DIR/results.csv and DIR/results.parquet, one row per point, rebuilt from
DIR/journal.jsonl, which gets each point as it finishes. Rerun the same command to resume:
finished points are skipped. exit codes: 0 done (failed points are rows with an error),
2 bad spec or an unwritable --out, 5 the table could not be written, 130 interrupted (what
finished is kept). All of them: pagedkv --help.
"""


def _add_backend_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="local: a process pool on this machine (default); ray: Ray tasks.",
    )
    parser.add_argument(
        "--address",
        metavar="ADDR",
        help="With --backend ray: the cluster (auto, ray://host:10001); default: a local Ray.",
    )
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="Processes (local; 1 runs in this process) or tasks in flight (ray); default: "
        "every core.",
    )
    parser.add_argument("--quiet", action="store_true", help="No progress bar, no table.")


def _check_backend(args: argparse.Namespace) -> None:
    """Before any work: ``--address`` names a Ray cluster, so it is read only with Ray (a local
    run would ignore it without a word)."""
    from pagedkv.errors import ConfigError

    if args.address is not None and args.backend != "ray":
        raise ConfigError("--address", args.address, "is read only with --backend ray")


def add_clock_flags(p: argparse.ArgumentParser) -> None:
    """``--cost-model`` and ``--profile``: the clock of every run (experiment, sweep, plan)."""
    p.add_argument(
        "--cost-model",
        choices=("roofline", "profiled"),
        help="Price every run with this cost model (default: the command's own, the roofline; "
        "'profiled' without --profile takes the built-in profile of the GPU x model).",
    )
    p.add_argument(
        "--profile",
        metavar="FILE|NAME",
        help="Operator profile JSON (pagedkv profile) or a built-in's name (a100-80gb/opt-13b); "
        "implies --cost-model profiled.",
    )


def _cmd_sweep(args: argparse.Namespace) -> int:
    from pagedkv.exits import require

    _check_backend(args)
    if args.backend == "ray":
        require("ray")
    from pagedkv.sweep.spec import SweepSpec
    from pagedkv.sweep.sweep import run_sweep

    spec = SweepSpec.from_yaml(args.spec)
    clock = _clock(args)
    if clock:
        spec = dataclasses.replace(spec, base={**spec.base, **clock})
    out = Path(args.out) if args.out else Path("results") / "sweep" / Path(args.spec).stem
    check_output_dir("--out", out, ("journal.jsonl", "results.csv", "results.parquet"))
    try:
        done = run_sweep(
            spec,
            out,
            backend=args.backend,
            workers=args.workers,
            address=args.address,
            progress=None if args.quiet else "sweep",
            retry_failed=args.retry_failed,
        )
    except KeyboardInterrupt:
        print(
            f"pagedkv: interrupted; finished points are kept in {out}: rerun the same "
            "command to run the rest",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    print(
        f"{done.total} points: {done.ran} run, {done.skipped} already done, "
        f"{done.failed} failed; wrote " + ", ".join(str(f) for f in done.files)
    )
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    import yaml

    from pagedkv.exits import require

    _check_backend(args)
    require("matplotlib", *(["ray"] if args.backend == "ray" else []))  # plan.png

    from pagedkv.errors import ConfigError
    from pagedkv.sweep.plan import run_plan
    from pagedkv.sweep.plan_output import plan_table, write_plan
    from pagedkv.sweep.plan_spec import PlanSpec

    overrides: dict[str, Any] = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError("--set", item, "must be KEY=VALUE (a simulate option)")
        try:
            overrides[key] = yaml.safe_load(value)
        except (yaml.YAMLError, ValueError) as e:
            problem = getattr(e, "problem", None) or str(e)
            allowed = f"must be KEY=VALUE, the value in YAML ({problem})"
            raise ConfigError("--set", item, allowed) from None
    overrides.update(_clock(args))
    if args.gpu:
        overrides["gpus"] = dict(_gpu_price(g) for g in args.gpu)
    for key in ("model", "tensor_parallel_sizes", "block_sizes", "schedulers", "seeds"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    for key in ("rate_low", "rate_high", "tolerance", "target_rate"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    slo = {k: getattr(args, f"slo_{k}") for k in ("ttft_p99", "tpot_p99", "normalized_latency_p99")}
    if any(v is not None for v in slo.values()):
        overrides["slo"] = {k: v for k, v in slo.items() if v is not None}
    spec = PlanSpec.from_yaml(args.plan, overrides) if args.plan else PlanSpec.from_dict(overrides)
    check_output_dir("--out", args.out, ("plan.csv", "plan.json", "plan.png"))
    try:
        results = run_plan(
            spec,
            backend=args.backend,
            workers=args.workers,
            address=args.address,
            progress=None if args.quiet else "plan",
        )
    except KeyboardInterrupt:
        print("pagedkv: interrupted; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    files = write_plan(results, spec, Path(args.out))
    if not args.quiet:
        from pagedkv.report.console import make_console

        make_console().print(plan_table(results, spec))
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _clock(args: argparse.Namespace) -> dict[str, Any]:
    """The simulate options of --cost-model and --profile (a profile implies 'profiled')."""
    out: dict[str, Any] = {}
    if args.cost_model is not None or args.profile is not None:
        out["cost_model"] = args.cost_model or "profiled"
    if args.profile is not None:
        out["profile"] = args.profile
    return out


def _gpu_price(text: str) -> tuple[str, float]:
    from pagedkv.errors import ConfigError

    name, sep, price = text.partition("=")
    try:
        return name, float(price)
    except ValueError:
        pass
    detail = "" if sep else " (the price is missing)"
    raise ConfigError("--gpu", text, f"must be NAME=PRICE per GPU-hour{detail}")


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this package's subcommands to the ``pagedkv`` parser."""
    sweep = sub.add_parser(
        "sweep",
        allow_abbrev=False,
        help="Run a grid of simulations (local processes or Ray) into one table; resumable.",
        description="Run every point of SPEC.yaml (a grid of simulate options x seeds) on local "
        "processes or Ray, into one tidy table (CSV and Parquet), resumable.",
        epilog=SWEEP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep.add_argument("spec", metavar="SPEC.yaml", help="The sweep spec (see below).")
    sweep.add_argument(
        "--out",
        type=path_arg,
        metavar="DIR",
        help="Results directory (default: results/sweep/<spec name>).",
    )
    sweep.add_argument(
        "--retry-failed", action="store_true", help="Also rerun points that recorded an error."
    )
    _add_backend_flags(sweep)
    add_clock_flags(sweep)
    sweep.set_defaults(func=_cmd_sweep)

    plan = sub.add_parser(
        "plan",
        allow_abbrev=False,
        help="Find each candidate deployment's highest rate inside the SLOs; rank by cost.",
        description="For each candidate (GPU x tensor-parallel degree x block size x "
        "scheduler), bisect on request rate for the highest rate at which every seed meets "
        "every SLO, then rank by cost per million requests. Options come from PLAN.yaml, "
        "flags override it.",
    )
    plan.add_argument("plan", nargs="?", metavar="PLAN.yaml", help="The plan (optional).")
    plan.add_argument("--model", help="Model preset (or any simulate option via --set).")
    plan.add_argument(
        "--gpu",
        action="append",
        metavar="NAME=PRICE",
        help="A candidate GPU and its price per GPU-hour; repeat for more.",
    )
    plan.add_argument(
        "--tp",
        dest="tensor_parallel_sizes",
        type=int,
        nargs="+",
        metavar="N",
        help="Tensor-parallel degrees (default 1).",
    )
    plan.add_argument(
        "--block-size",
        dest="block_sizes",
        type=int,
        nargs="+",
        metavar="N",
        help="Block sizes (default 16).",
    )
    plan.add_argument(
        "--scheduler",
        dest="schedulers",
        nargs="+",
        metavar="NAME",
        help="Schedulers (default vllm).",
    )
    for metric in ("ttft_p99", "tpot_p99", "normalized_latency_p99"):
        flag = "--slo-" + metric.replace("_", "-")
        plan.add_argument(
            flag, dest=f"slo_{metric}", type=float, metavar="S", help=f"SLO: {metric} in seconds."
        )
    plan.add_argument("--seeds", type=int, metavar="N", help="Seeds per probe (default 3).")
    plan.add_argument("--rate-low", type=float, metavar="R", help="Lowest rate (default 0.25).")
    plan.add_argument("--rate-high", type=float, metavar="R", help="Highest rate (default 64).")
    plan.add_argument(
        "--tolerance", type=float, metavar="X", help="Relative precision of the rate (0.05)."
    )
    plan.add_argument(
        "--target-rate",
        type=float,
        metavar="R",
        help="A rate to serve (req/s): each candidate's fewest replicas that meet the SLOs at "
        "R / replicas, and their cost per hour; ranks by that cost.",
    )
    plan.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="A simulate option for every probe."
    )
    plan.add_argument(
        "--out",
        type=path_arg,
        metavar="DIR",
        default="results/plan",
        help="Output (default: results/plan).",
    )
    _add_backend_flags(plan)
    add_clock_flags(plan)
    plan.set_defaults(func=_cmd_plan)
