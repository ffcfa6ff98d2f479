"""``pagedkv generate``: runs the real path, writes deterministic JSON, reads prompt files and
Hugging Face config.json shapes, refuses bad input with exit code 2, and builds its parser
without importing torch."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from pagedkv.cli import main
from pagedkv.errors import ConfigError
from pagedkv.tensors.generate import load_prompts


def _run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["generate", *argv])
    return code, out.getvalue()


def test_generate_prints_tokens_and_writes_identical_json(tmp_path: Path) -> None:
    args = ["--model", "gpt2", "--num-prompts", "3", "--prompt-len", "5", "--max-new-tokens", "4"]
    code, out = _run(*args, "--block-size", "2", "--json", str(tmp_path / "a.json"))
    assert code == 0
    assert "tokens/s" in out
    data = json.loads((tmp_path / "a.json").read_text())
    assert [len(o["output_token_ids"]) for o in data["outputs"]] == [4, 4, 4]
    assert "timing" not in data
    # same inputs, byte-identical JSON; and the block size does not change the tokens
    code, _ = _run(*args, "--block-size", "2", "--json", str(tmp_path / "b.json"))
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    code, _ = _run(*args, "--block-size", "16", "--json", str(tmp_path / "c.json"))
    other = json.loads((tmp_path / "c.json").read_text())
    assert other["outputs"] == data["outputs"]


def test_generate_under_preemption_from_a_prompt_file(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("1 2 3 4 5 6 7\n\n9 8 7\n10 11 12 13 14 15 16 17 18\n")
    common = ["--prompts", str(prompts), "--max-new-tokens", "6", "--block-size", "2"]
    _run(*common, "--json", str(tmp_path / "free.json"))
    code, _ = _run(
        *common,
        "--num-gpu-blocks",
        "8",
        "--preemption-mode",
        "swap",
        "--json",
        str(tmp_path / "p.json"),
    )
    assert code == 0
    tight = json.loads((tmp_path / "p.json").read_text())
    free = json.loads((tmp_path / "free.json").read_text())
    assert tight["summary"]["preemptions"] > 0
    assert [o["output_token_ids"] for o in tight["outputs"]] == [
        o["output_token_ids"] for o in free["outputs"]
    ]


def test_generate_from_a_hf_config_json(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 32,
                "num_attention_heads": 4,
                "num_key_value_heads": 1,
                "num_hidden_layers": 1,
                "intermediate_size": 48,
                "vocab_size": 40,
                "max_position_embeddings": 64,
            }
        )
    )
    code, out = _run("--config", str(config), "--num-prompts", "2", "--prompt-len", "3")
    assert code == 0
    assert out.count("request ") == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--block-size", "0"], "block_size"),
        (["--model", "bert"], "model"),
        (["--preemption-mode", "drop"], "preemption_mode"),
        (["--scheduler", "nope"], "scheduler"),
        (["--prompt-len", "500"], "max_position"),
        (["--temperature", "-1"], "temperature"),
        (["--temperature", "nan"], "temperature: got nan"),
        (["--num-gpu-blocks", str(10**10)], "num_gpu_blocks: got 10000000000"),
        (["--num-gpu-blocks", str(10**7)], "num_gpu_blocks: got 10000000; must keep a run within"),
        (
            ["--num-prompts", "65536", "--prompt-len", "100000"],
            "num_prompts: got 65536; must keep a run",
        ),
        (["--seed", str(2**64)], "seed"),
        (["--num-beams", "100000"], "num_beams"),
        (["--config", ""], "config: got ''; an empty path"),
    ],
)
def test_bad_input_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_prompt_file_errors_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2\n3 x\n")
    with pytest.raises(ConfigError, match="line 2"):
        load_prompts(bad, 10)
    bad.write_text("1 20\n")
    with pytest.raises(ConfigError, match="line 1"):
        load_prompts(bad, 10)
    with pytest.raises(ConfigError, match="no such file"):
        load_prompts(tmp_path / "missing.txt", 10)


def test_parser_does_not_import_torch() -> None:
    probe = (
        "import sys\n"
        "from pagedkv.cli import build_parser\n"
        "build_parser()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_generate_that_serves_nothing_exits_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One block for prompts of 64 tokens: every request rejected, said on stderr."""
    argv = ["--num-gpu-blocks", "1", "--prompt-len", "64", "--num-prompts", "2"]
    code, _ = _run(*argv, "--json", str(tmp_path / "g.json"))
    assert code == 4
    assert "served nothing: 2 of 2 requests rejected" in capsys.readouterr().err
    outputs = json.loads((tmp_path / "g.json").read_text())["outputs"]
    assert all("can never hold it" in o["reject_reason"] for o in outputs)


def test_generate_json_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--num-prompts", "1", "--prompt-len", "4", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["summary"]["num_requests"] == 1
    assert "request 0" in captured.err  # the printed lines moved to stderr


def test_generate_that_deadlocks_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No preemption and too few blocks for four growing requests: they all stick."""
    argv = ["--scheduler", "greedy-nopreempt", "--num-gpu-blocks", "5", "--num-prompts", "4"]
    code, _ = _run(*argv, "--prompt-len", "16", "--max-new-tokens", "40")
    assert code == 3
    err = capsys.readouterr().err
    assert err.startswith("pagedkv: deadlock: 4 requests can never proceed")


def test_a_prompt_file_too_large_for_the_cap_is_refused_before_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p.txt"
    path.write_text("1 2 3\n" * 1000)
    assert len(load_prompts(path, 10)) == 1000
    monkeypatch.setattr("pagedkv.footprint.MEMORY_CAP_BYTES", 1000)
    with pytest.raises(ConfigError, match="must keep a run within") as err:
        load_prompts(path, 10)
    assert err.value.field == "prompts"
