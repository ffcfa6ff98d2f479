"""Content keys for prefix caching: a block's key is chained over its parent's key.

    key(block 0) = SHA-256( ROOT   | salt | tokens[0 : bs] )
    key(block j) = SHA-256( key(j-1) | tokens[j*bs : (j+1)*bs] )

so equal keys mean equal tokens *and* equal prefixes, which is what K/V depend on.

Why SHA-256 and not Python's ``hash()``: the key decides whether two requests share K/V
memory. ``hash()`` is 64 bits, randomised per process for str/bytes and trivially collidable for
ints, so two different prefixes could map to one block and a request would silently attend to
another request's K/V (vLLM moved to SHA-256 for the same reason). SHA-256 has no known
collisions and its 32-byte digests are stable across processes and machines, which keeps runs
deterministic. Token ids are encoded as fixed-width little-endian int64 and the salt with a
length prefix, so no two different inputs share an encoding. Ids held as runs
(``token_runs.TokenRuns``) are encoded the same way, from each run in C: a block gets the same
key whether its ids come as runs or as a tuple.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence

from pagedkv.errors import ConfigError
from pagedkv.memory.token_runs import INT64_MAX, INT64_MIN, TokenRuns

BlockHash = bytes
"""A 32-byte SHA-256 digest."""

ROOT: BlockHash = bytes(32)
"""The parent key of a sequence's first block."""


INT64 = "integers in [-2**63, 2**63)"


def check_token_ids(field: str, token_ids: Sequence[int]) -> None:
    """Refuse ids the keys cannot encode (floats, strings, values outside int64) before
    anything changes: the packing below is the very encoding ``hash_block`` uses, done once
    over the whole sequence, in C (numpy integers pass, as ``operator.index`` takes them);
    runs are checked from their bounds, O(runs)."""
    if type(token_ids) is TokenRuns:  # (not isinstance: an ABC check costs per call)
        runs = token_ids.runs
        if len(runs) == 1 and runs[0].start >= INT64_MIN and runs[0].stop <= INT64_MAX + 1:
            return  # one run in range (a simulated request's slice: the usual call)
        bounds = token_ids.bounds()
        if bounds is not None and not INT64_MIN <= bounds[0] <= bounds[1] <= INT64_MAX:
            bad = bounds[0] if bounds[0] < INT64_MIN else bounds[1]
            raise ConfigError(field, bad, f"token ids must be {INT64}")
        return
    if len(token_ids) == 1:  # a decode round's one id (the usual call): no packing needed
        t = token_ids[0]
        if type(t) is int and INT64_MIN <= t <= INT64_MAX:
            return
    try:
        struct.pack(f"<{len(token_ids)}q", *token_ids)
    except (struct.error, TypeError):
        for t in token_ids:  # only on the error path: name the first bad id
            try:
                struct.pack("<q", t)
            except (struct.error, TypeError):
                raise ConfigError(field, t, f"token ids must be {INT64}") from None
        raise ConfigError(field, type(token_ids).__name__, "must be a sequence of ids") from None


def hash_block(
    parent: BlockHash | None, token_ids: Sequence[int], salt: bytes | None = None
) -> BlockHash:
    """Key of one full block given its parent's key (``None`` for the first block).

    ``salt`` (for example a per-tenant cache salt) only enters the first block's key; the chain
    carries it to every later block.
    """
    h = hashlib.sha256(ROOT if parent is None else parent)
    if parent is None and salt:
        h.update(struct.pack("<q", len(salt)))
        h.update(salt)
    if type(token_ids) is TokenRuns:  # (not isinstance: an ABC check costs per call)
        h.update(token_ids.int64_le())
    else:
        h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


def int64_le(token_ids: Sequence[int]) -> bytes:
    """The ids as consecutive little-endian int64, in C: the bytes ``hash_block`` hashes."""
    if type(token_ids) is TokenRuns:  # (not isinstance: an ABC check costs per call)
        return token_ids.int64_le()
    return struct.pack(f"<{len(token_ids)}q", *token_ids)


def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    salt: bytes | None = None,
    parent: BlockHash | None = None,
    max_blocks: int | None = None,
) -> list[BlockHash]:
    """Keys of the consecutive full blocks of ``token_ids`` (a trailing partial block has none).

    Each key is ``hash_block``'s (tests/memory/test_prefix_hash.py checks), from one encoding
    of all the blocks' ids made in C: a block then costs a digest, not a Python int per id."""
    n = len(token_ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    if n <= 0:
        return []
    return chain_keys(int64_le(token_ids[: n * block_size]), block_size, salt, parent)


def chain_keys(
    data: bytes, block_size: int, salt: bytes | None = None, parent: BlockHash | None = None
) -> list[BlockHash]:
    """``hash_blocks`` of ids already encoded (``int64_le``): one key per whole block
    (``iter_keys`` as a list, without a generator's cost per key)."""
    if parent is None:
        return list(iter_keys(data, block_size, salt))
    width = 8 * block_size
    sha = hashlib.sha256
    keys = []
    for off in range(0, len(data) - width + 1, width):
        parent = sha(parent + data[off : off + width]).digest()
        keys.append(parent)
    return keys


def iter_keys(
    data: bytes, block_size: int, salt: bytes | None = None, parent: BlockHash | None = None
) -> Iterator[BlockHash]:
    """The keys of the whole blocks of ``data`` (ids encoded by ``int64_le``), one at a time
    (a prefix lookup stops at its first miss). A key is SHA-256 over the parent's key and then
    the block's bytes, so one digest of their concatenation gives it."""
    width = 8 * block_size
    start = 0
    if parent is None:  # the first block: the root, and the salt if any (``hash_block``)
        if len(data) < width:
            return
        h = hashlib.sha256(ROOT)
        if salt:
            h.update(struct.pack("<q", len(salt)))
            h.update(salt)
        h.update(data[:width])
        parent = h.digest()
        yield parent
        start = width
    sha = hashlib.sha256
    for off in range(start, len(data) - width + 1, width):
        parent = sha(parent + data[off : off + width]).digest()
        yield parent
