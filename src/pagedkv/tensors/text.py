"""Text in, text out: a checkpoint's ``tokenizer.json`` through the ``tokenizers`` library.

``encode`` adds the special tokens the tokenizer's post-processor declares (a BOS, for most
Llama-family tokenizers), as Hugging Face's ``tokenizer(text)`` does; ``decode`` drops special
tokens (EOS included), as ``skip_special_tokens=True`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pagedkv.errors import ConfigError


class TextTokenizer:
    """A ``tokenizers.Tokenizer``, reduced to what generation needs."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_file(cls, path: str | Path) -> TextTokenizer:
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as exc:  # tokenizers raises a bare Exception for a bad file
            raise ConfigError("tokenizer", str(path), f"must be a tokenizer.json ({exc})") from exc

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text).ids)

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))
