"""``pagedkv profile`` and ``pagedkv fidelity``: flags from ``ProfileConfig`` and
``FidelityConfig`` (their help texts); torch is imported only when a command runs."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any

from pagedkv.io import path_arg
from pagedkv.tensors.profile_config import FidelityConfig, ProfileConfig
from pagedkv.validation import field_help

_RENAMED = {"block_sizes": "block_size"}  # --block-size 1 16 64


def _add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        name = _RENAMED.get(f.name, f.name)
        flag = "--" + name.replace("_", "-")
        text = field_help(cls, f.name).replace("%", "%%") + f" (default: {f.default})"
        hint = hints[f.name]
        if hint is bool:
            parser.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text
            )
        elif f.name == "block_sizes":
            parser.add_argument(flag, dest=f.name, type=int, nargs="+", metavar="N", help=text)
        else:
            kinds = [a for a in (hint, *typing.get_args(hint)) if a in (int, float, str)]
            kind = kinds[0] if kinds else str
            parser.add_argument(flag, dest=f.name, type=kind, default=None, help=text)


def _values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name, None)
        if value is not None:
            out[f.name] = tuple(value) if f.name == "block_sizes" else value
    return out


def _cmd_profile(args: argparse.Namespace) -> int:
    import time

    from pagedkv.io import check_output_file, is_stdout
    from pagedkv.tensors.profile_ops import points
    from pagedkv.tensors.profiler import profile, progress_bar

    cfg = ProfileConfig(**_values(args, ProfileConfig))
    check_output_file("--out", args.out)  # before minutes of measuring
    start = time.perf_counter()
    with progress_bar(points(cfg), "profiling") as bar:
        task = bar.task_ids[0]
        result = profile(cfg, tick=lambda total: bar.update(task, total=total, advance=1))
    result.write(args.out)
    print(
        f"wrote {args.out}: {cfg.model} on {cfg.device} ({result.source['device_name']}), "
        f"{cfg.dtype}, block sizes {list(cfg.block_sizes)}, in {time.perf_counter() - start:.1f} s",
        file=sys.stderr if is_stdout(args.out) else sys.stdout,  # stdout then holds the profile
    )
    return 0


def _cmd_fidelity(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from pagedkv.io import atomic_write_json, check_output_file, is_stdout
    from pagedkv.tensors.fidelity import fidelity

    if args.json is not None:
        check_output_file("--json", args.json)  # before the real runs
    result = fidelity(FidelityConfig(**_values(args, FidelityConfig)))
    table = Table(title="simulated / real - 1 (per-step: |error|)")
    parts = {"profiled": result["summary"], "roofline": result["roofline"]}
    if "operators" in result:
        parts["operators' sum"] = result["operators"]
    if "noise" in result:
        parts["real again (noise)"] = result["noise"]
    parts["real times replayed"] = result["replay"]  # the schedule's share of each error
    table.add_column("metric", justify="left")
    for col in parts:
        table.add_column(col, justify="right")

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    for q in ("median", "p90"):
        table.add_row(f"step error {q}", *(pct(e["step_error"][q]) for e in parts.values()))
    for name in ("throughput", "ttft", "tpot", "e2e"):
        table.add_row(f"{name} error", *(f"{e[name + '_error']:+.1%}" for e in parts.values()))
    table.add_row(
        "iterations (real / sim)",
        *(f"{e['iterations_real']} / {e['iterations_sim']}" for e in parts.values()),
    )
    Console(width=120, stderr=is_stdout(args.json)).print(table)  # stdout: the JSON alone
    if args.json is not None:
        atomic_write_json(args.json, result)
    return 0


def register_profiling(sub: argparse._SubParsersAction[Any]) -> None:
    prof = sub.add_parser(
        "profile",
        allow_abbrev=False,
        help="Measure a model's operators on this device (torch) into a profile JSON.",
        description="Time one layer of the model at its real shapes (random weights): the "
        "linear layers against batched tokens, paged attention (prefill; decode at each block "
        "size), the lm head, swaps, and the executor's own per-step work; fit them and write "
        "the profile that `--cost-model profiled --profile FILE` reads. Needs torch.",
    )
    _add_flags(prof, ProfileConfig)
    prof.add_argument(
        "--out", type=path_arg, metavar="PROFILE.json", required=True, help="Where to write it."
    )
    prof.set_defaults(func=_cmd_profile)
    fid = sub.add_parser(
        "fidelity",
        allow_abbrev=False,
        help="Run one workload for real (torch) and simulated; report the simulator's errors.",
        description="The same workload through the real executor (measured step times) and "
        "through the simulator priced by the profile and by the roofline; prints per-step "
        "and aggregate errors. Needs torch.",
    )
    _add_flags(fid, FidelityConfig)
    fid.add_argument(
        "--json", type=path_arg, metavar="OUT", help="Write the errors and the runs as JSON."
    )
    fid.set_defaults(func=_cmd_fidelity)
