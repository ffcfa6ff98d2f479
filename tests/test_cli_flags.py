"""vLLM's spellings of our flags: every boolean flag as --x, --no-x and --x=VALUE; -tp; the
vllm bench serve names of workload options (``simulation.FLAT_ALIASES``)."""

from __future__ import annotations

import pytest

from pagedkv.cli import _BOOL_VALUES, _FLAT, _flag_types, _load_config, build_parser, main
from pagedkv.errors import ConfigError
from pagedkv.exits import EXIT_BAD_INPUT
from pagedkv.simulation import FLAT_ALIASES, SimulationConfig

BOOL_KEYS = sorted(k for k, (kind, _) in _flag_types().items() if kind is bool)


def parsed(argv: list[str]) -> dict[str, object]:
    args = build_parser().parse_args(["simulate", *argv])
    return {k[len(_FLAT) :]: v for k, v in vars(args).items() if k.startswith(_FLAT)}


def test_there_are_boolean_flags_to_test() -> None:
    assert {"enable_chunked_prefill", "enable_prefix_caching", "async_scheduling"} <= set(BOOL_KEYS)


@pytest.mark.parametrize("key", BOOL_KEYS)
def test_every_boolean_flag_takes_vllms_spellings(key: str) -> None:
    flag = "--" + key.replace("_", "-")
    assert parsed([flag]) == {key: True}
    assert parsed(["--no-" + flag[2:]]) == {key: False}
    for text, value in _BOOL_VALUES.items():
        for spelled in (text, text.upper(), text.capitalize()):
            assert parsed([f"{flag}={spelled}"]) == {key: value}
    assert parsed([]) == {}  # not given: the config's default


@pytest.mark.parametrize("argv", [["--enable-chunked-prefill=maybe"], ["--no-reference=true"]])
def test_a_bad_boolean_is_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *argv]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("pagedkv: error: --")


def test_chunked_prefill_false_is_the_default_and_true_turns_it_on() -> None:
    off = SimulationConfig.from_flat(parsed(["--enable-chunked-prefill=False"]))
    assert off == SimulationConfig.from_flat({})
    on = SimulationConfig.from_flat(parsed(["--enable-chunked-prefill=true"]))
    assert on.scheduler.enable_chunked_prefill is True


def test_tp_is_tensor_parallel_size() -> None:
    assert (
        parsed(["-tp", "4"])
        == parsed(["--tensor-parallel-size", "4"])
        == {"tensor_parallel_size": 4}
    )


ALIAS_VALUES = {"dataset_name": "random", "dataset_path": "t.jsonl", "num_prompts": 7}
CONTEXT = {"dataset_path": {"workload": "trace"}}


@pytest.mark.parametrize("alias", sorted(FLAT_ALIASES))
def test_an_alias_is_its_key(alias: str) -> None:
    key, value = FLAT_ALIASES[alias], ALIAS_VALUES[alias]
    context = {"workload": "random", **CONTEXT.get(alias, {})}
    if alias == "dataset_name":
        context = {}
    by_alias = SimulationConfig.from_flat({**context, alias: value})
    assert by_alias == SimulationConfig.from_flat({**context, key: value})
    assert by_alias == SimulationConfig.from_flat({**context, key: value, alias: value})
    assert alias not in by_alias.to_flat()
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_flat({**context, key: value, alias: "other"})
    assert info.value.field == alias


def test_alias_flags_reach_the_config() -> None:
    argv = ["--dataset-name", "random", "--num-prompts", "12", "--random-input-len", "64"]
    args = build_parser().parse_args(["simulate", *argv])
    config = _load_config(args)
    assert (config.workload.kind.value, config.workload.num_requests) == ("random", 12)
    assert config.workload.random_input_len == 64


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--random-input-len", "64"], "random_input_len"),  # the lesson is not 'random'
        (["--dataset-name", "random", "--tokenizer", "tok"], "tokenizer"),
        (["--dataset-name", "random", "--dataset-path", "s.json"], "trace_path"),
        (["--dataset-name", "sharegpt"], "trace_path"),
        (["--dataset-name", "sharegpt", "--dataset-path", "s.csv"], "trace_path"),
        (["--num-prompts", "5", "--num-requests", "6"], "num_prompts"),
        (["--burstiness", "0.5"], "burstiness"),  # no rate: all at once
        (["--arrival", "gamma", "--request-rate", "inf"], "request_rate"),
        (["--max-concurrency", "0"], "max_concurrency"),
        (["--dataset-name", "random", "--random-range-ratio", "1"], "random_range_ratio"),
    ],
)
def test_a_combination_that_makes_no_sense_is_one_line(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *argv]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith(f"pagedkv: error: {field}: ")
