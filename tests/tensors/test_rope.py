"""RoPE variants: our inverse frequencies and attention factor equal transformers' own
(``ROPE_INIT_FUNCTIONS``) for random parameters of every type, on a Llama config."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.tensors.model_config import DecoderConfig
from pagedkv.tensors.rope import Rope


@st.composite
def rope_configs(draw: st.DrawFn) -> dict[str, Any]:
    head_dim = draw(st.sampled_from([8, 16, 64, 128]))
    max_pos = draw(st.sampled_from([64, 512, 4096]))
    original = draw(st.sampled_from([16, 32, 64]))
    theta = draw(st.sampled_from([10000.0, 500000.0, 1e6]))
    kind = draw(
        st.sampled_from(
            ["default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional"]
        )
    )
    factor = draw(st.floats(1.0, 32.0))
    rope: dict[str, Any] = {"rope_type": kind, "rope_theta": theta}
    if kind in ("linear", "dynamic", "llama3"):
        rope["factor"] = factor
    if kind == "llama3":
        low = draw(st.floats(0.5, 2.0))
        rope.update(low_freq_factor=low, high_freq_factor=low + draw(st.floats(0.5, 8.0)))
        rope["original_max_position_embeddings"] = original
    if kind == "yarn":
        rope.update(factor=factor, original_max_position_embeddings=original)
        if draw(st.booleans()):
            rope.update(beta_fast=draw(st.floats(8, 64)), beta_slow=draw(st.floats(0.5, 4)))
        if draw(st.booleans()):
            rope.update(mscale=draw(st.floats(0.5, 2)), mscale_all_dim=draw(st.floats(0.5, 2)))
    if kind == "longrope":
        half = head_dim // 2
        rope["short_factor"] = draw(st.lists(st.floats(1, 4), min_size=half, max_size=half))
        rope["long_factor"] = draw(st.lists(st.floats(1, 64), min_size=half, max_size=half))
        rope["original_max_position_embeddings"] = original
    if kind == "proportional":
        rope["factor"] = factor
        rope["partial_rotary_factor"] = draw(st.sampled_from([0.25, 0.5, 1.0]))
    return {
        "head_dim": head_dim,
        "hidden_size": 4 * head_dim,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": max_pos,
        "rope_parameters": rope,
    }


@settings(max_examples=80, deadline=None)
@given(args=rope_configs())
def test_inverse_frequencies_equal_transformers(args: dict[str, Any]) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = LlamaConfig(num_hidden_layers=1, vocab_size=8, intermediate_size=8, **args)
    mine = Rope(DecoderConfig.from_hf(hf.to_dict()), "cpu")
    kind = args["rope_parameters"]["rope_type"]
    if kind == "default":
        expected = 1.0 / (
            args["rope_parameters"]["rope_theta"]
            ** (torch.arange(0, args["head_dim"], 2, dtype=torch.int64).float() / args["head_dim"])
        )
        factor = 1.0
    else:
        expected, factor = ROPE_INIT_FUNCTIONS[kind](hf, "cpu")
    torch.testing.assert_close(mine.inv_freq, expected.float(), atol=0, rtol=1e-6)
    assert mine.attention_factor == pytest.approx(factor, rel=1e-12)
    if kind == "longrope":
        original = args["rope_parameters"]["original_max_position_embeddings"]
        long, _ = ROPE_INIT_FUNCTIONS[kind](hf, "cpu", seq_len=original + 1)
        assert mine.long_inv_freq is not None
        torch.testing.assert_close(mine.long_inv_freq, long.float(), atol=0, rtol=1e-6)
