"""`pagedkv simulate`: flags from the flat config, YAML configs, JSON output, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pagedkv.cli import _ProgressBar, main
from pagedkv.simulation import SimulationConfig, flat_help

ROOT = Path(__file__).resolve().parents[1]
LESSON = [
    "--workload",
    "lesson",
    "--cost-model",
    "unit",
    "--num-gpu-blocks",
    "100",
    "--max-model-len",
    "256",
]
SUMMARY_KEYS = {
    "num_requests",
    "finished",
    "rejected",
    "deadlocked",
    "sim_time",
    "iterations",
    "request_throughput",
    "output_token_throughput",
    "max_running",
    "mean_running",
    "preemptions",
    "swap_outs",
    "ttft",
    "tpot",
    "e2e",
    "normalized_latency",
    "memory",
}
MEMORY_KEYS = {
    "token_states",
    "reservation",
    "internal_fragmentation",
    "external_fragmentation",
    "free",
    "token_utilization",
    "pool_occupancy",
}


def run(argv: list[str], path: Path | None = None) -> tuple[int, dict[str, Any] | None]:
    code = main(["simulate", *argv, *(["--json", str(path)] if path else [])])
    return code, json.loads(path.read_text()) if path and path.exists() else None


def test_lesson_writes_the_result(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, data = run(LESSON, tmp_path / "out.json")
    assert code == 0
    assert data is not None
    assert set(data) == {"config", "summary", "requests"}
    summary = data["summary"]
    assert summary.keys() >= SUMMARY_KEYS
    for key in ("ttft", "tpot", "e2e", "normalized_latency"):
        assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
    assert summary["memory"].keys() >= MEMORY_KEYS
    assert summary["finished"] == summary["num_requests"] == len(data["requests"]) == 20
    assert summary["deadlocked"] is False
    assert data["config"]["num_gpu_blocks"] == 100
    out = capsys.readouterr().out
    assert "vllm on lesson" in out
    assert "20 of 20" in out
    assert "token utilization" in out


def test_same_flags_give_byte_identical_json(tmp_path: Path) -> None:
    flags = [*LESSON, "--scheduler", "reserve", "--quiet"]
    assert main(["simulate", *flags, "--json", str(tmp_path / "a.json")]) == 0
    assert main(["simulate", *flags, "--json", str(tmp_path / "b.json")]) == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


# Runs whose books hold the most state (swap, queues and priorities, prefix keys, groups,
# pinned prefixes, contiguous regions); a trace whose sessions are named by strings.
_HASHED_RUNS = [
    "--num-requests 200 --request-rate 20 --preemption-mode swap --num-gpu-blocks 200",
    "--workload trace --trace-path {trace} --scheduler vllm-v1 --scheduling-policy priority "
    "--enable-prefix-caching --num-gpu-blocks 12 --block-size 4",
    "--workload shared-prefix --prefix-len 64 --num-prefixes 4 --enable-prefix-caching "
    "--num-requests 150 --request-rate 10 --num-gpu-blocks 120 --eviction-policy lfu",
    "--num-requests 40 --num-samples 3 --num-gpu-blocks 150 --request-rate 5",
    "--num-requests 30 --beam-width 3 --num-gpu-blocks 150 --request-rate 5",
    "--workload shared-prefix --prefix-len 64 --num-prefixes 3 --enable-pinned-prefixes "
    "--num-requests 100 --request-rate 10",
    "--scheduler orca-oracle --num-requests 150 --request-rate 10",
]


def test_json_is_byte_identical_across_processes_whose_hashes_differ(tmp_path: Path) -> None:
    """No order in the books or the records may follow Python's per-process str hashing."""
    import os
    import subprocess
    import sys

    trace = tmp_path / "sessions.csv"
    trace.write_text(
        "arrival_time,prompt_len,output_len,session_id,priority\n"
        "0,20,5,alpha,2\n0.1,30,6,beta,1\n0.2,40,5,alpha,0\n0.2,50,7,gamma,1\n0.3,80,9,beta,3\n"
    )
    base = ["--model", "OPT-13B", "--gpu", "A100-40GB", "--workload", "sharegpt-like", "--quiet"]
    outs: list[list[bytes]] = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        runs = []
        for i, flags in enumerate(_HASHED_RUNS):
            out = tmp_path / f"{hash_seed}-{i}.json"
            argv = [*base, *flags.format(trace=trace).split(), "--json", str(out)]
            cmd = [sys.executable, "-m", "pagedkv.cli", "simulate", *argv]
            subprocess.run(cmd, env=env, check=True, timeout=300, capture_output=True)
            runs.append(out.read_bytes())
        outs.append(runs)
    for flags, one, two in zip(_HASHED_RUNS, *outs, strict=True):
        assert one == two, flags
        assert json.loads(one)["summary"]["finished"] > 0, flags


def test_greedy_deadlock_exits_3_and_still_writes_everything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, data = run([*LESSON, "--scheduler", "greedy-nopreempt"], tmp_path / "g.json")
    assert code == 3
    assert data is not None
    summary = data["summary"]
    assert summary["deadlocked"] is True
    unfinished = sorted(r["request_id"] for r in data["requests"] if r["status"] != "finished")
    assert summary["stuck_requests"] == unfinished
    assert unfinished
    assert len(data["requests"]) == summary["num_requests"] == 20
    assert summary.keys() >= SUMMARY_KEYS
    err = capsys.readouterr().err
    assert "deadlock" in err
    assert ", ".join(map(str, unfinished)) in err


def test_the_deadlock_config_exits_3(tmp_path: Path) -> None:
    config = ROOT / "configs" / "lesson-greedy-deadlock.yaml"
    assert run(["--config", str(config), "--quiet"])[0] == 3


@pytest.mark.parametrize("name", ["lesson.yaml", "sharegpt-opt13b.yaml"])
def test_example_configs_are_valid(name: str) -> None:
    config = SimulationConfig.from_yaml(ROOT / "configs" / name)
    assert config.hardware.block_size == 16


def _bad_yaml(tmp_path: Path) -> list[str]:
    path = tmp_path / "bad.yaml"
    path.write_text("workload: lesson\nblok_size: 16\n")
    return ["--config", str(path)]


def _bad_trace(tmp_path: Path) -> list[str]:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"arrival_time": 0, "prompt_len": 10, "output_len": 5}\n'
        '{"arrival_time": 1, "prompt_len": 12.5, "output_len": 5}\n'
    )
    return ["--workload", "trace", "--trace-path", str(path)]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (lambda _: ["--scheduler", "fcfs-magic"], "scheduler: got 'fcfs-magic'"),
        (lambda _: ["--block-size", "0"], "block_size: got 0"),
        (lambda _: ["--workload", "sharegpt-like", "--request-rate=-2"], "request_rate: got -2"),
        (_bad_yaml, "blok_size"),
        (_bad_trace, "t.jsonl:2: prompt_len: got 12.5"),
    ],
    ids=["scheduler", "block-size", "request-rate", "yaml-key", "trace-line"],
)
def test_bad_input_exits_2_and_writes_nothing(
    flags: Any, named: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "never.json"
    code, data = run(flags(tmp_path), out)
    assert code == 2
    assert data is None
    assert not out.exists()
    assert list(tmp_path.glob("*never*")) == []  # no temporary file left either
    err = capsys.readouterr().err
    assert err.startswith("pagedkv: error: ")
    assert named in err


def test_a_flag_overrides_the_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "workload: lesson\ncost_model: unit\nnum_gpu_blocks: 100\nmax_model_len: 256\n"
        "scheduler: vllm\nblock_size: 16\n"
    )
    flags = ["--config", str(path), "--scheduler", "orca-max", "--num-gpu-blocks", "120"]
    code, data = run([*flags, "--quiet"], tmp_path / "o.json")
    assert code == 0
    assert data is not None
    config = data["config"]
    assert (config["scheduler"], config["num_gpu_blocks"]) == ("orca-max", 120)
    assert config["block_size"] == 16  # from the file
    assert (config["workload"], config["max_model_len"]) == ("lesson", 256)


def test_booleans_have_both_forms(tmp_path: Path) -> None:
    _, on = run([*LESSON, "--enable-prefix-caching", "--quiet"], tmp_path / "on.json")
    _, off = run([*LESSON, "--no-enable-prefix-caching", "--quiet"], tmp_path / "off.json")
    assert on is not None
    assert off is not None
    assert on["config"]["enable_prefix_caching"] is True
    assert off["config"]["enable_prefix_caching"] is False


def test_quiet_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*LESSON, "--quiet"])[0] == 0
    assert capsys.readouterr() == ("", "")


def test_help_lists_every_flat_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for key in flat_help():
        assert "--" + key.replace("_", "-") in out
    assert "exit codes" in out


def test_no_progress_bar_off_a_terminal() -> None:
    bar = _ProgressBar(enabled=True)
    bar(1, 5000)  # stderr is captured here, not a terminal
    assert not bar.enabled
    bar.close()


def test_a_run_that_serves_nothing_exits_4_and_says_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Every request rejected: exit 4, the reason on stderr, --json still written, and the
    token utilization of a run that held nothing is n/a (null), not 100%."""
    argv = ["--workload", "lesson", "--cost-model", "unit", "--num-gpu-blocks", "3"]
    code, data = run(argv, tmp_path / "r.json")
    assert code == 4
    assert data is not None
    assert data["summary"]["finished"] == 0
    assert data["summary"]["memory"]["token_utilization"] is None
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert err[0] == "pagedkv: served nothing: 20 of 20 requests rejected"
    reason = data["requests"][0]["reject_reason"]
    assert err[1].endswith(f"like request 0: {reason}")
    row = next(line for line in captured.out.splitlines() if "token utilization" in line)
    assert "n/a" in row
    assert "100" not in row


def test_an_empty_trace_serves_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "empty.jsonl"
    trace.write_text("")
    code, _ = run(["--workload", "trace", "--trace-path", str(trace), "--quiet"])
    assert code == 4
    assert "no requests" in capsys.readouterr().err


def test_a_reject_under_the_watermark_names_it(tmp_path: Path) -> None:
    """8 prompt blocks fit the 10-block pool, but not beside the 3 the watermark keeps free."""
    argv = ["--workload", "fixed", "--num-requests", "3", "--prompt-len", "128"]
    argv += ["--output-len", "16", "--num-gpu-blocks", "10", "--cost-model", "unit", "--quiet"]
    code, data = run([*argv, "--watermark", "0.3"], tmp_path / "r.json")
    assert code == 4
    assert data is not None
    assert all("watermark" in r["reject_reason"] for r in data["requests"])
    code, data = run([*argv, "--watermark", "0"], tmp_path / "r.json")
    assert code == 0  # the watermark was the cause
    assert data is not None
    assert data["summary"]["memory"]["token_utilization"] is not None


def _yaml(text: str | bytes) -> Any:
    def flags(tmp_path: Path) -> list[str]:
        path = tmp_path / "c.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
        return ["--config", str(path)]

    return flags


def _trace(name: str, content: str | bytes, *extra: str) -> Any:
    def flags(tmp_path: Path) -> list[str]:
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        return ["--workload", "trace", "--trace-path", str(path), *extra]

    return flags


HEADER = "arrival_time,prompt_len,output_len\n"
BAD_NUMBERS = [
    (
        lambda _: ["--swap-space", "nan"],
        "swap_space: got nan; must be a finite number in [0, 1024]",
    ),
    (lambda _: ["--swap-space", "inf"], "swap_space: got inf"),
    (lambda _: ["--swap-space", "1e12"], "swap_space: got 1000000000000.0"),
    (_yaml("swap_space: .nan\n"), "swap_space: got nan"),
    (_yaml("swap_space: .inf\n"), "swap_space: got inf"),
    (_yaml("swap_space: 1.0e+12\n"), "swap_space: got 1000000000000.0"),
    (lambda _: ["--block-size", str(10**30)], f"block_size: got {10**30}; must be an integer in"),
    (lambda _: ["--num-gpu-blocks", str(10**10)], "num_gpu_blocks: got 10000000000"),
    (
        lambda _: ["--num-gpu-blocks", str(1 << 30)],
        "num_gpu_blocks: got 1073741824; must keep a run within 4 GiB",
    ),
    (
        lambda _: (
            [
                "--workload",
                "fixed",
                "--prompt-len",
                "8",
                "--output-len",
                "8",
                "--num-requests",
                str(10**9),
            ]
        ),
        "num_requests: got 1000000000",
    ),
    (lambda _: ["--workload", "sharegpt-like", "--request-rate", "nan"], "request_rate: got nan"),
    (lambda _: ["--workload", "sharegpt-like", "--request-rate=-inf"], "request_rate: got -inf"),
    (
        lambda _: ["--arrival", "poisson", "--request-rate", "inf"],
        "request_rate: got inf; inf means all at once",
    ),
    (lambda _: ["--watermark", "nan"], "watermark: got nan"),
    (lambda _: ["--max-model-len", str(1 << 40)], "max_model_len: got 1099511627776"),
    (lambda _: ["--seed", "-1"], "seed: got -1"),
    (_trace("t.csv", HEADER + f"0,{10**24},5\n"), f"t.csv:2: prompt_len: got '{10**24}'"),
    (
        _trace("t.jsonl", '{"arrival_time":0,"prompt_len":10,"output_len":' + "9" * 5000 + "}\n"),
        "t.jsonl:1: json",
    ),
    (
        _trace("t.csv", HEADER.strip() + ",prefix_id,prefix_len\n" + f"0,10,5,{10**20},4\n"),
        f"request 0: prefix_id: got '{10**20}'",
    ),
]
BAD_FILES = [
    (_yaml(b"workload: lesson\n# caf\xe9\n"), "c.yaml'; must be UTF-8 text (line 2: byte 0xe9"),
    (_yaml("workload: [lesson\n"), "c.yaml'; must be valid YAML (line 2"),
    (lambda p: ["--config", str(p)], "must be a file, not a directory"),
    (lambda p: ["--workload", "trace", "--trace-path", str(p / "d.csv")], "d.csv'; must be a file"),
    (
        _trace("t.csv", HEADER + '0,10,"5\n1,10,5\n'),
        "t.csv:2: csv: got ''; must be valid CSV: a quoted",
    ),
    (
        _trace("t.csv", b"arrival_time,prompt_len,output_len\n0,1\xff,5\n"),
        "t.csv'; must be UTF-8 text (line 2",
    ),
]


@pytest.mark.parametrize(("flags", "named"), BAD_NUMBERS + BAD_FILES)
def test_bad_numbers_and_files_exit_2_with_one_line(
    flags: Any, named: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "d.csv").mkdir()
    out = tmp_path / "never.json"
    code, data = run(flags(tmp_path), out)
    assert (code, data) == (2, None)
    err = capsys.readouterr().err
    assert err.startswith("pagedkv: error: ")
    assert err.count("\n") == 1  # one line, no traceback
    assert named in err


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("t.csv", HEADER + "0,10,5\n1,12,3\n"),
        ("t.jsonl", '{"arrival_time":0,"prompt_len":10,"output_len":5}\n'),
    ],
)
def test_a_trace_with_a_bom_reads_as_without(name: str, content: str, tmp_path: Path) -> None:
    plain, bom = tmp_path / "plain", tmp_path / "bom"
    plain.mkdir()
    bom.mkdir()
    (plain / name).write_text(content, encoding="utf-8")
    (bom / name).write_text("\ufeff" + content, encoding="utf-8")
    results = []
    for d in (plain, bom):
        code, data = run(
            ["--workload", "trace", "--trace-path", str(d / name), *LESSON[2:]], d / "o.json"
        )
        assert code == 0
        assert data is not None
        results.append(data["requests"])
    assert results[0] == results[1]


def test_a_yaml_of_nested_aliases_is_one_short_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    levels = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        a, b = chr(ord("a") + i - 1), chr(ord("a") + i)
        levels.append(f"&{b} [" + ",".join([f"*{a}"] * 9) + "]")
    path = tmp_path / "laughs.yaml"
    path.write_text("block_size: [" + ", ".join(levels) + "]\n")  # 9^9 strings once expanded
    assert run(["--config", str(path)])[0] == 2
    err = capsys.readouterr().err
    assert err.startswith("pagedkv: error: block_size: got [[")
    assert err.count("\n") == 1
    assert len(err) < 1000
