"""The ``pagedkv`` command line: ``bench`` (the main benchmark) and ``simulate`` (one run) here;
every other subcommand lives beside what it drives, in a module of ``COMMAND_MODULES`` that
defines ``register(subparsers)`` (it adds its parsers, each with ``set_defaults(func=...)``,
and imports nothing heavy, torch above all, until its command runs)."""

from __future__ import annotations

import argparse
import enum
import importlib
import os
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from pagedkv import __version__
from pagedkv.errors import ConfigError, PagedKVError
from pagedkv.exits import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_DEADLOCK,
    EXIT_INTERRUPTED,
    EXIT_MISSING_EXTRA,
    EXIT_OK,
    EXIT_SERVED_NOTHING,
    EXIT_WRITE_FAILED,
    missing_extra,
    served_nothing,
)
from pagedkv.exits import epilog as exit_codes_epilog
from pagedkv.io import OutputError, path_arg

COMMAND_MODULES = (
    "pagedkv.experiments.commands",  # experiment, claims, reproduce
    "pagedkv.report.commands",  # report
    "pagedkv.tensors.commands",  # generate
    "pagedkv.sweep.commands",  # sweep, plan
)
PROGRESS_MIN_REQUESTS = 1000
"""Shorter runs end before a progress bar would tell anything."""
_FLAT = "flat."  # namespace prefix of the generated flags, so no flat key can clash with ours

SIMULATE_EPILOG = f"""\
Every option is also a key of --config FILE.yaml (block_size: 16); flags given on the command
line override the file. Unset options keep pagedkv.simulate's defaults.

--json - writes the JSON on standard output (the table then goes to stderr).
--save-result FILE writes vllm bench serve's result file (docs/vllm-results.md).
vLLM's flags (docs/vllm-flags.md): booleans as --x, --no-x or --x=true|false; -tp;
vllm bench serve's --dataset-name, --num-prompts, --request-rate inf, --max-concurrency ...;
a vLLM flag pagedkv does not model (--enforce-eager) is refused in one line, saying why.

exit codes (all of them: pagedkv --help):
  {EXIT_OK}  the run finished
  {EXIT_BAD_INPUT}  bad input (an option, the YAML file, a trace line, an unwritable --json or
     --save-result); nothing is written
  {EXIT_DEADLOCK}  the run deadlocked: the stuck requests are named on stderr, and --json is
     still written, complete, with summary.deadlocked = true and summary.stuck_requests
  {EXIT_SERVED_NOTHING}  the run served nothing (every request rejected, or none given): the
     reasons on stderr; --json is still written
  {EXIT_WRITE_FAILED}  --json or --save-result could not be written after the run (a full disk):
     one line names it
"""


def _console(stderr: bool = False) -> Console:
    """stderr: when the command's output file is standard output."""
    from pagedkv.report.console import make_console

    return make_console(stderr=stderr)


def _cmd_bench(args: argparse.Namespace) -> int:
    from pagedkv.experiments.bench import side_by_side, titles
    from pagedkv.experiments.lesson_capacity import lesson_capacity
    from pagedkv.io import (
        atomic_write_json,
        atomic_write_text,
        check_output_dir,
        check_output_file,
        is_stdout,
        output_set,
    )
    from pagedkv.report.summary import bench_tables
    from pagedkv.report.tables import lesson_capacity_summary, lesson_capacity_table

    out = Path(args.out)
    check_output_dir("--out", out, ("bench.json", "bench.csv"))
    if args.json:
        check_output_file("--json", args.json)
    console = _console(stderr=is_stdout(args.json))
    capacity = lesson_capacity()
    console.print(lesson_capacity_table(capacity))
    for line in lesson_capacity_summary(capacity):
        console.print(line, soft_wrap=True)
    runs = side_by_side()
    for workload, title in titles().items():
        console.print()
        for table in bench_tables([r for r in runs.rows if r.workload == workload], title, console):
            console.print(table)
    with output_set():  # all three files, or none
        atomic_write_json(
            out / "bench.json",
            {"lesson_capacity": capacity.to_dict(), "side_by_side": runs.to_dict()},
        )
        atomic_write_text(out / "bench.csv", runs.to_csv())
        if args.json:
            atomic_write_json(args.json, capacity.to_dict())
    console.print(f"Wrote {out / 'bench.json'} and {out / 'bench.csv'}", soft_wrap=True)
    return EXIT_OK


def _value_type(hint: Any) -> type:
    """The type a flag parses to: the field's type without None (enums are given as text)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0]
    found: type = next((t for t in (bool, int, float) if hint is t), str)  # bool: an int
    return found


def _enum_values(hint: Any) -> list[str]:
    """The values of an enum annotation (``Arrival | None`` too), for the flag's metavar."""
    for a in (hint, *typing.get_args(hint)):
        if isinstance(a, type) and issubclass(a, enum.Enum):
            return [str(m.value) for m in a]
    return []


def _flag_types() -> dict[str, tuple[type, Any]]:
    """Flat key -> (parse type, annotation), read from the config dataclasses' fields."""
    from pagedkv.simulation import FLAT_KEYS, SimulationConfig, flat_help

    top = typing.get_type_hints(SimulationConfig)
    out: dict[str, tuple[type, Any]] = {}
    for key in flat_help():
        if key in FLAT_KEYS:
            section, name = FLAT_KEYS[key][0]
            hint = typing.get_type_hints(top[section])[name]
        else:  # a run option (reference, trace_steps): a field of SimulationConfig itself
            hint = top[key]
        out[key] = (_value_type(hint), hint)
    return out


_SHORT_FLAGS = {"tensor_parallel_size": "-tp"}
"""vLLM's short spellings of our flags."""
_BOOL_VALUES = {"true": True, "false": False, "1": True, "0": False}
"""What ``--flag=VALUE`` takes, in any case: vLLM's ``StoreBoolean`` (``--flag=true|false``,
``--enable-chunked-prefill=False``) and 1/0."""


class _BoolFlag(argparse.Action):
    """A boolean flag the ways vLLM spells one: ``--x``, ``--no-x`` (vLLM's
    ``BooleanOptionalAction``), and ``--x=VALUE`` with a value of ``_BOOL_VALUES``."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        strings = []
        for flag in option_strings:
            strings.append(flag)
            if flag.startswith("--"):
                strings.append("--no-" + flag[2:])
        super().__init__(strings, dest, nargs="?", metavar="BOOL", **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        negated = bool(option_string and option_string.startswith("--no-"))
        if values is None:
            setattr(namespace, self.dest, not negated)
            return
        value = _BOOL_VALUES.get(str(values).lower())
        if negated or value is None:
            allowed = "takes no value" if negated else "takes true, false, 1 or 0"
            raise ConfigError(str(option_string), values, allowed)
        setattr(namespace, self.dest, value)


def _add_simulate_flags(parser: argparse.ArgumentParser) -> None:
    from pagedkv.simulation import FLAT_KEYS, flat_help

    groups: dict[str, argparse._ArgumentGroup] = {}
    types_ = _flag_types()
    for key, text in flat_help().items():
        section = FLAT_KEYS[key][0][0] if key in FLAT_KEYS else "run"
        if section not in groups:
            groups[section] = parser.add_argument_group(f"{section} options")
        kind, hint = types_[key]
        flags = [
            "--" + key.replace("_", "-"),
            *([_SHORT_FLAGS[key]] if key in _SHORT_FLAGS else []),
        ]
        common: dict[str, Any] = {
            "dest": _FLAT + key,
            "help": text.replace("%", "%%"),
            "default": argparse.SUPPRESS,  # only what was given reaches from_flat
        }
        if kind is bool:
            groups[section].add_argument(*flags, action=_BoolFlag, **common)
            continue
        choices = _enum_values(hint)
        metavar = "{" + ",".join(choices) + "}" if choices else {int: "N", float: "X"}.get(kind)
        groups[section].add_argument(*flags, type=kind, metavar=metavar or key.upper(), **common)


class _ProgressBar:
    """A rich progress bar with ETA on stderr, fed by ``simulate``'s ``progress(done, total)``.

    It starts on the first report, and only for a run of >= PROGRESS_MIN_REQUESTS requests with
    stderr a terminal: never in a pipe, a log or a test.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            if not (self.enabled and total >= PROGRESS_MIN_REQUESTS and sys.stderr.isatty()):
                self.enabled = False
                return
            from rich import progress as rp

            self._bar = rp.Progress(
                rp.TextColumn("simulating"),
                rp.BarColumn(),
                rp.MofNCompleteColumn(),
                rp.TextColumn("requests"),
                rp.TimeElapsedColumn(),
                rp.TextColumn("ETA"),
                rp.TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("simulate", total=total)
        self._bar.update(self._task, completed=done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _load_config(args: argparse.Namespace) -> Any:
    import yaml

    from pagedkv.simulation import SimulationConfig

    given = {k[len(_FLAT) :]: v for k, v in vars(args).items() if k.startswith(_FLAT)}
    if args.config is None:
        return SimulationConfig.from_flat(given)
    try:
        return SimulationConfig.from_yaml(args.config, given)
    except OSError as e:
        raise ConfigError("config", args.config, f"cannot be read ({e.strerror})") from None
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError("config", args.config, f"must be valid YAML ({problem})") from None


def _result_format(args: argparse.Namespace) -> Any:
    """The ``VllmResultConfig`` of ``--save-result``'s flags (None without it); a flag of it
    given alone is an error, as is a bad value."""
    from pagedkv.report.vllm_result import (
        DEFAULT_METRIC_PERCENTILES,
        DEFAULT_PERCENTILE_METRICS,
        VllmResultConfig,
    )

    given = {
        "--percentile-metrics": args.percentile_metrics,
        "--metric-percentiles": args.metric_percentiles,
        "--goodput": args.goodput,
    }
    if args.save_result is None:
        for flag, value in given.items():
            if value is not None:
                raise ConfigError(flag, value, "is read only with --save-result FILE")
        return None
    return VllmResultConfig.from_flags(
        args.percentile_metrics or DEFAULT_PERCENTILE_METRICS,
        args.metric_percentiles or DEFAULT_METRIC_PERCENTILES,
        args.goodput,
    )


def _add_save_result_flags(parser: argparse.ArgumentParser) -> None:
    """``vllm bench serve``'s result file and the flags that shape it (vLLM's names)."""
    from pagedkv.report.vllm_result import DEFAULT_METRIC_PERCENTILES as PERCENTILES
    from pagedkv.report.vllm_result import DEFAULT_PERCENTILE_METRICS as METRICS

    group = parser.add_argument_group("vllm bench serve result (docs/vllm-results.md)")
    group.add_argument(
        "--save-result",
        type=path_arg,
        metavar="FILE",
        help="Also write the run as vllm bench serve's result JSON (its keys and units; "
        "records every output token's time; - for standard output).",
    )
    group.add_argument(
        "--percentile-metrics",
        metavar="LIST",
        help=f"Metrics given mean/median/std/percentile keys, comma-separated of "
        f"ttft,tpot,itl,e2el (default {METRICS}).",
    )
    group.add_argument(
        "--metric-percentiles",
        metavar="LIST",
        help=f"Percentiles of those metrics, comma-separated (default {PERCENTILES}).",
    )
    group.add_argument(
        "--goodput",
        metavar="KEY:VALUE",
        nargs="+",
        help="SLOs in ms for request_goodput, keys ttft, tpot, e2el (e.g. ttft:200 tpot:50).",
    )


def _cmd_simulate(args: argparse.Namespace) -> int:
    from pagedkv.io import atomic_write_json, check_output_file, is_stdout
    from pagedkv.report.summary import summary_table
    from pagedkv.simulation import simulate

    config = _load_config(args)
    result_format = _result_format(args)
    if args.save_result:
        check_output_file("--save-result", args.save_result)
    if args.json:
        check_output_file("--json", args.json)
    from pagedkv.models.models import get_model
    from pagedkv.workloads.factory import workload_notes

    notes = [*get_model(config.hardware.model).notes, *workload_notes(config.workload)]
    for note in notes:  # what a config.json or a ShareGPT reader assumed
        print(f"pagedkv: note: {note}", file=sys.stderr)
    bar = _ProgressBar(enabled=not args.quiet)
    try:
        result = simulate(config, progress=bar, token_times=result_format is not None)
    finally:
        bar.close()
    if not args.quiet:  # first: a --json that cannot be written then loses less
        to_stderr = is_stdout(args.json) or is_stdout(args.save_result)
        _console(stderr=to_stderr).print(summary_table(result.config, result.summary))
    if args.json:
        atomic_write_json(args.json, result.to_dict())
    if result_format is not None:
        from pagedkv.report.vllm_result import simulation_vllm_result

        atomic_write_json(args.save_result, simulation_vllm_result(result, result_format))
    if result.summary["deadlocked"]:
        stuck = result.summary["stuck_requests"]
        print(
            f"pagedkv: deadlock: {len(stuck)} requests can never proceed; stuck request ids: "
            + ", ".join(map(str, stuck)),
            file=sys.stderr,
        )
        return EXIT_DEADLOCK
    if not result.summary["finished"]:
        for line in served_nothing(result.requests):
            print(line, file=sys.stderr)
        return EXIT_SERVED_NOTHING
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="pagedkv",
        description="PagedAttention's memory manager and the lab bench to study it.",
        epilog=exit_codes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pagedkv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser(
        "bench",
        allow_abbrev=False,
        help="The main benchmark: the lesson's capacity table and every scheduler side by side.",
        description="What each allocator must hold for the course lesson's 20 requests, then "
        "every scheduler simulated on the lesson and on a ShareGPT-like workload.",
    )
    bench.add_argument(
        "--out",
        type=path_arg,
        metavar="DIR",
        default="results",
        help="Write bench.json and bench.csv here (atomically; default: results).",
    )
    bench.add_argument(
        "--json",
        type=path_arg,
        metavar="PATH",
        help="Also write the capacity table alone as JSON (atomically; - for standard output).",
    )
    bench.set_defaults(func=_cmd_bench)
    simulate = sub.add_parser(
        "simulate",
        allow_abbrev=False,
        help="Simulate one serving run (pagedkv.simulate) and print its summary.",
        description="Simulate one serving run: a workload, a scheduler and its memory manager, "
        "on a GPU and a model (or the unit clock), and print its summary.",
        epilog=SIMULATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    simulate.add_argument(
        "--config", metavar="FILE.yaml", help="Options as flat keys in a YAML mapping."
    )
    simulate.add_argument(
        "--json",
        type=path_arg,
        metavar="PATH",
        help="Write config, summary and per-request records as JSON (atomically, sorted keys; "
        "- for standard output).",
    )
    simulate.add_argument(
        "--quiet", action="store_true", help="Print no summary table and no progress bar."
    )
    _add_save_result_flags(simulate)
    _add_simulate_flags(simulate)
    from pagedkv.vllm_flags import add_refused_flags

    add_refused_flags(simulate)
    simulate.set_defaults(func=_cmd_simulate)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (``pagedkv.exits``). No traceback for a user's mistake,
    a full disk, a Ctrl-C or a closed pipe: one line on stderr (none for the pipe)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--version"]:  # answered before the parser imports the simulator
        print(f"pagedkv {__version__}")
        return EXIT_OK
    try:
        args = build_parser().parse_args(argv)
        code: int = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except OutputError as exc:  # after the work: the result is lost, say where
        print(f"pagedkv: error: {exc}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    except PagedKVError as exc:
        print(f"pagedkv: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ModuleNotFoundError as exc:
        line = missing_extra(exc)
        if line is None:
            raise
        print(f"pagedkv: error: {line}", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    except KeyboardInterrupt:
        print("pagedkv: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    return code


def _discard_stdout() -> None:
    """Point the stdout descriptor at /dev/null, so that the interpreter's last flush of what
    is still buffered does not fail again (Python's documented way out of a broken pipe)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stream: nothing to flush
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
