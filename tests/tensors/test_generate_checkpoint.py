"""``pagedkv generate --model DIR``: a checkpoint directory with its tokenizer, text prompts in
and text out, EOS and ``--stop-token-ids``, ``--max-tokens``, and the engine flags of
``simulate`` that apply (prefix caching, chunked prefill, preemption, block and pool sizes).
Outputs equal transformers' ``generate`` with the checkpoint's EOS; a tight schedule gives the
roomy run's outputs; bad input exits 2 with a one-line message."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from pagedkv.cli import main
from pagedkv.tensors.checkpoint import load_checkpoint
from pagedkv.tensors.generate import generate
from pagedkv.tensors.generate_config import GenerateConfig
from tests.tensors.checkpoints import CORPUS, EOS, hf_generate

LINES = CORPUS.splitlines()


def _run(tmp_path: Path, *argv: str) -> tuple[int, str, dict[str, Any]]:
    out = io.StringIO()
    target = tmp_path / "out.json"
    with contextlib.redirect_stdout(out):
        code = main(["generate", *argv, "--json", str(target)])
    data = json.loads(target.read_text()) if code == 0 else {}
    return code, out.getvalue(), data


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_text_in_text_out_equals_hf_generate(
    family: str, checkpoint_dir: Callable[..., Path], tmp_path: Path
) -> None:
    path = checkpoint_dir(family)
    texts = [line[:30] for line in LINES[:4]]
    argv = ["--model", str(path), "--max-tokens", "8", "--block-size", "4"]
    for text in texts:
        argv += ["--prompt", text]
    code, printed, data = _run(tmp_path, *argv)
    assert code == 0
    tok = load_checkpoint(path).tokenizer
    assert tok is not None
    for out, text in zip(data["outputs"], texts, strict=True):
        ids = tok.encode(text)
        assert tuple(out["output_token_ids"]) == hf_generate(path, ids, 8, eos=(EOS,))
        assert out["output_text"] == tok.decode(out["output_token_ids"])
        assert out["output_text"] in printed
        stopped = out["output_token_ids"][-1] == EOS
        assert out["finish_reason"] == ("stop" if stopped else "length")


def test_a_tight_schedule_with_prefix_caching_gives_the_roomy_outputs(
    checkpoint_dir: Callable[..., Path], tmp_path: Path
) -> None:
    path = checkpoint_dir("qwen2")
    prompts = tmp_path / "prompts.txt"
    stem = LINES[5][:40]
    prompts.write_text("\n".join([stem, stem + " again", LINES[6][:20], stem, ""]) + "\n")
    common = ["--model", str(path), "--prompts", str(prompts), "--max-tokens", "6", "--ignore-eos"]
    code, _, roomy = _run(tmp_path, *common, "--block-size", "4")
    assert code == 0
    assert all(len(o["output_token_ids"]) == 6 for o in roomy["outputs"])
    assert {o["finish_reason"] for o in roomy["outputs"]} == {"length"}
    code, _, tight = _run(
        tmp_path,
        *common,
        "--block-size", "4",
        "--num-gpu-blocks", "9",
        "--preemption-mode", "swap",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--max-num-batched-tokens", "8",
    )  # fmt: skip
    assert code == 0
    assert tight["summary"]["prefix_hit_tokens"] > 0
    assert tight["summary"]["preemptions"] > 0
    assert [o["output_token_ids"] for o in tight["outputs"]] == [
        o["output_token_ids"] for o in roomy["outputs"]
    ]


def test_stop_token_ids_and_ignore_eos(checkpoint_dir: Callable[..., Path], tmp_path: Path) -> None:
    path = checkpoint_dir("llama")
    common = ["--model", str(path), "--prompt", LINES[2][:25], "--max-tokens", "10"]
    _, _, free = _run(tmp_path, *common, "--ignore-eos")
    ids = free["outputs"][0]["output_token_ids"]
    assert len(ids) == 10
    stop = ids[3]
    _, _, stopped = _run(tmp_path, *common, "--ignore-eos", "--stop-token-ids", str(stop), "99")
    out = stopped["outputs"][0]
    assert out["output_token_ids"] == ids[: ids.index(stop) + 1]
    assert out["finish_reason"] == "stop"
    assert stopped["config"]["stop_token_ids"] == [stop, 99]


def test_token_id_prompts_and_sharded_weights(
    checkpoint_dir: Callable[..., Path], tmp_path: Path
) -> None:
    prompts = tmp_path / "ids.txt"
    prompts.write_text("1 5 9 13\n1 7 7\n")
    runs = [
        generate(
            GenerateConfig(
                model=str(checkpoint_dir("mistral", sharded=sharded)),
                prompts=str(prompts),
                prompt_format="ids",
                max_new_tokens=5,
                ignore_eos=True,
            )
        )["outputs"]
        for sharded in (False, True)
    ]
    assert runs[0] == runs[1]
    path = checkpoint_dir("mistral")
    for out, line in zip(runs[0], ["1 5 9 13", "1 7 7"], strict=True):
        prompt = tuple(int(t) for t in line.split())
        assert tuple(out["output_token_ids"]) == hf_generate(path, prompt, 5)


def test_max_tokens_defaults_to_the_generation_config(
    checkpoint_dir: Callable[..., Path], tmp_path: Path
) -> None:
    path = Path(shutil.copytree(checkpoint_dir("gpt2"), tmp_path / "m"))
    gen = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**gen, "max_new_tokens": 3}))
    result = generate(GenerateConfig(model=str(path), prompt=("A block",), ignore_eos=True))
    assert len(result["outputs"][0]["output_token_ids"]) == 3


def test_the_other_engine_flags_keep_the_outputs(
    checkpoint_dir: Callable[..., Path], tmp_path: Path
) -> None:
    path = checkpoint_dir("gemma")
    common = ["--model", str(path), "--max-tokens", "5", "--ignore-eos", "--block-size", "4"]
    for text in LINES[8:12]:
        common += ["--prompt", text[:24]]
    _, _, roomy = _run(tmp_path, *common)
    code, _, other = _run(
        tmp_path,
        *common,
        "--num-gpu-blocks", "10",
        "--preemption-mode", "swap",
        "--swap-space", "0.0002",
        "--max-num-seqs", "3",
        "--max-model-len", "64",
        "--watermark", "0.1",
        "--enable-prefix-caching",
        "--eviction-policy", "lfu",
    )  # fmt: skip
    assert code == 0
    c = load_checkpoint(path).decoder.config
    block_bytes = 2 * c.num_layers * 4 * c.num_kv_heads * c.head_dim * 8  # float64
    assert other["summary"]["num_cpu_blocks"] == int(0.0002 * 2**30) // block_bytes
    assert other["summary"]["swap_outs"] > 0
    assert [o["output_token_ids"] for o in other["outputs"]] == [
        o["output_token_ids"] for o in roomy["outputs"]
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "no/such/dir"], "model"),
        (["--max-model-len", "1000"], "max_model_len"),
        (["--eviction-policy", "mru"], "eviction_policy"),
        (["--swap-space", "-1"], "swap_space"),
        (["--watermark", "1.5"], "watermark"),
        (["--group-preemption-mode", "drop"], "group_preemption_mode"),
        (["--prompt", "hello"], "tokenizer.json"),  # a built-in model has no tokenizer
        (["--model", "gpt2", "--config", "x.json", "--prompt-format", "bad"], "prompt_format"),
        (["--prompt", "a", "--prompts", "p.txt"], "excludes --prompts"),
        (["--stop-token-ids", "-3"], "stop_token_ids"),
    ],
)
def test_bad_input_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") <= 2


def test_a_checkpoint_excludes_config(checkpoint_dir: Callable[..., Path]) -> None:
    from pagedkv.errors import ConfigError

    with pytest.raises(ConfigError, match="built-in"):
        GenerateConfig(model=str(checkpoint_dir("llama")), config="config.json")


def test_sampled_text_writes_byte_identical_json(
    checkpoint_dir: Callable[..., Path], tmp_path: Path
) -> None:
    argv = ["--model", str(checkpoint_dir("qwen3")), "--prompt", LINES[0][:20], "--prompt"]
    argv += [LINES[1][:20], "--temperature", "1.0", "--seed", "4", "--max-tokens", "6"]
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path in paths:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["generate", *argv, "--json", str(path)]) == 0
    assert paths[0].read_bytes() == paths[1].read_bytes()
