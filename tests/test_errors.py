"""ConfigError's message: the field, the value as Python writes it, what is allowed; a value
too large to show is cut, so a small hostile file cannot make the message itself huge."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pagedkv.errors import ConfigError

PLAIN = st.one_of(
    st.integers(-(10**100), 10**100),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=300),
    st.booleans(),
    st.none(),
    st.lists(st.integers(0, 10**6), max_size=8),
)


@given(value=PLAIN)
def test_a_plain_value_is_shown_as_repr(value: object) -> None:
    err = ConfigError("block_size", value, "must be an integer in [1, 65536]")
    assert str(err) == f"block_size: got {value!r}; must be an integer in [1, 65536]"
    assert err.value is value


def test_an_exponentially_aliased_value_is_cut_quickly() -> None:
    # what a few lines of YAML aliases build: 9^9 strings behind 9 shared levels
    value: object = ["lol"] * 9
    for _ in range(8):
        value = [value] * 9
    message = str(ConfigError("block_size", value, "must be an integer"))  # repr: 10^9 items
    assert len(message) < 1000
    assert message.startswith("block_size: got [[")
    assert message.endswith("; must be an integer")
