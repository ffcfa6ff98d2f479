"""Loading a checkpoint directory: single file and shards give the same decoder, generation
defaults come from generation_config.json, the tokenizer round-trips text, and every bad
directory, state dict or unsupported config feature is a one-line error naming it."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from safetensors.torch import load_file, save_file

from pagedkv.errors import ConfigError
from pagedkv.tensors.checkpoint import load_checkpoint
from pagedkv.tensors.model import Decoder
from pagedkv.tensors.model_config import DecoderConfig
from tests.tensors.checkpoints import CORPUS, EOS, hf_model


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_weights(path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    state = load_file(str(path / "model.safetensors"))
    edit(state)
    save_file(state, str(path / "model.safetensors"))


def _edit_config(path: Path, **changes: Any) -> None:
    data = json.loads((path / "config.json").read_text())
    data.update(changes)
    (path / "config.json").write_text(json.dumps(data))


def _same(a: Decoder, b: Decoder) -> None:
    assert a.config == b.config
    assert a.weights.keys() == b.weights.keys()
    assert all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
    for x, y in zip(a.layers, b.layers, strict=True):
        assert x.keys() == y.keys()
        assert all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_shards_single_file_and_in_memory_model_agree(
    family: str, checkpoint_dir: Callable[..., Path]
) -> None:
    single = load_checkpoint(checkpoint_dir(family))
    sharded = load_checkpoint(checkpoint_dir(family, sharded=True))
    assert len(list(checkpoint_dir(family, sharded=True).glob("model-*.safetensors"))) > 1
    _same(single.decoder, sharded.decoder)
    _same(single.decoder, Decoder.from_hf(hf_model(family)))
    assert single.decoder.dtype == torch.float64  # as stored
    as_f32 = load_checkpoint(checkpoint_dir(family), dtype=torch.float32)
    assert as_f32.decoder.dtype == torch.float32


def test_generation_defaults_and_tokenizer(
    checkpoint_dir: Callable[..., Path], tmp_path: Path
) -> None:
    ck = load_checkpoint(checkpoint_dir("llama"))
    assert ck.generation.eos_token_ids == (EOS,)
    assert ck.tokenizer is not None
    line = CORPUS.splitlines()[3]
    ids = ck.tokenizer.encode(line)
    assert ids[0] == ck.generation.bos_token_id
    assert ck.tokenizer.decode(ids) == line
    assert max(ids) < ck.decoder.config.vocab_size
    # generation_config.json wins over config.json, and a list of eos ids is kept whole
    path = _copy(checkpoint_dir("llama"), tmp_path / "m")
    gen = json.loads((path / "generation_config.json").read_text())
    gen.update(eos_token_id=[EOS, 5], max_new_tokens=7)
    (path / "generation_config.json").write_text(json.dumps(gen))
    ck = load_checkpoint(path)
    assert ck.generation.eos_token_ids == (EOS, 5)
    assert ck.generation.max_new_tokens == 7
    (path / "generation_config.json").unlink()
    (path / "tokenizer.json").unlink()
    ck = load_checkpoint(path)
    assert ck.generation.eos_token_ids == (EOS,)  # from config.json
    assert ck.tokenizer is None


def _drop_q_proj(state: dict[str, torch.Tensor]) -> None:
    del state["model.layers.1.self_attn.q_proj.weight"]


def _add_bias(state: dict[str, torch.Tensor]) -> None:
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64, dtype=torch.float64)


def _drop_lm_head(state: dict[str, torch.Tensor]) -> None:
    del state["lm_head.weight"]


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (_drop_q_proj, "model.layers.1.self_attn.q_proj.weight"),
        (_add_bias, "model.layers.0.self_attn.q_proj.bias"),
        # an untied config without lm_head.weight: refused, never the embedding reused
        (_drop_lm_head, "lm_head.weight"),
    ],
)
def test_state_dict_is_read_strictly(
    edit: Callable[[dict[str, torch.Tensor]], None],
    named: str,
    checkpoint_dir: Callable[..., Path],
    tmp_path: Path,
) -> None:
    path = _copy(checkpoint_dir("llama"), tmp_path / "m")
    _edit_weights(path, edit)
    with pytest.raises(ConfigError, match="state_dict") as err:
        load_checkpoint(path)
    assert named in str(err.value)
    assert "\n" not in str(err.value)


def test_a_relabelled_config_is_refused(
    checkpoint_dir: Callable[..., Path], tmp_path: Path
) -> None:
    """Qwen2 weights (q/k/v biases) under a config relabelled llama: the biases are unexpected."""
    path = _copy(checkpoint_dir("qwen2"), tmp_path / "m")
    _edit_config(path, model_type="llama")
    with pytest.raises(ConfigError, match=r"q_proj\.bias"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"rope_parameters": {"rope_type": "su", "rope_theta": 10000.0}}, "rope_scaling.rope_type"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "rope_scaling.factor"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"pretraining_tp": 2}, "pretraining_tp"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        ({"model_type": "qwen2", "layer_types": ["full_attention", "chunked"]}, "layer_types"),
        ({"model_type": "falcon"}, "model_type"),
    ],
)
def test_unsupported_config_features_are_named(changes: dict[str, Any], key: str) -> None:
    config = hf_model("llama").config.to_dict()
    config.update(changes)
    with pytest.raises(ConfigError) as err:
        DecoderConfig.from_hf(config)
    assert err.value.field == key


def test_gpt2_reorder_and_upcast_is_refused() -> None:
    config = hf_model("gpt2").config.to_dict()
    config["reorder_and_upcast_attn"] = True
    with pytest.raises(ConfigError, match="reorder_and_upcast_attn"):
        DecoderConfig.from_hf(config)


def test_bad_directories(checkpoint_dir: Callable[..., Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="checkpoint directory"):
        load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"config\.json"):
        load_checkpoint(tmp_path)
    path = _copy(checkpoint_dir("llama"), tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"model\.safetensors"):
        load_checkpoint(path)
    sharded = _copy(checkpoint_dir("llama", sharded=True), tmp_path / "s")
    next(sharded.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(ConfigError, match="missing"):
        load_checkpoint(sharded)


@pytest.mark.parametrize("family", ["llama-bias", "qwen3", "gpt2", "gemma"])
def test_every_missing_or_foreign_tensor_is_named(family: str) -> None:
    """Exhaustively: dropping any one tensor of the state dict, or adding any tensor another
    family has and this one does not, is refused naming that tensor."""
    model = hf_model(family)
    state = dict(model.state_dict())
    config = model.config.to_dict()
    Decoder.from_hf(state, config=config)  # the whole state dict loads
    tied = DecoderConfig.from_hf(config).tie_word_embeddings
    for name in state:
        if tied and name == "lm_head.weight":
            continue  # a tied model may list the embedding twice, or not
        with pytest.raises(ConfigError, match=re.escape(name)):
            Decoder.from_hf({k: v for k, v in state.items() if k != name}, config=config)
    others = {k for f in ("llama-bias", "qwen3", "gpt2") for k in hf_model(f).state_dict()}
    for name in sorted(others - set(state))[:40]:
        with pytest.raises(ConfigError, match=re.escape(name)):
            Decoder.from_hf({**state, name: torch.zeros(1)}, config=config)
