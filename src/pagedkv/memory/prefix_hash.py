"""Content keys for prefix caching: a block's key is chained over its parent's key.

    key(block 0) = SHA-256( ROOT     | [S | len(salt) | salt] | code(tokens[0 : bs]) )
    key(block j) = SHA-256( key(j-1) | code(tokens[j*bs : (j+1)*bs]) )

so equal keys mean equal tokens *and* equal prefixes, which is what K/V depend on.

A block's ``code`` is a canonical encoding of its ids, decided by the ids alone (not by how
they are held): ``R | first | n`` (the tag byte, then two little-endian int64) when its n >= 1
ids are consecutive, first, first + 1, ..., first + n - 1; ``T | id_0 | ... | id_{n-1}``
(each a little-endian int64) otherwise. Both are injective and the tag tells them apart, so
two blocks get one code iff they hold the same ids. After the 32-byte parent the message is
therefore parsed one way: a tag, or (first block only) ``S`` and the salt, length first, then
a tag. A simulated workload's ids are runs of consecutive ids (``token_runs.TokenRuns``), so a
block of one run costs one digest of 49 bytes, not an int packed per id.

Why SHA-256 and not Python's ``hash()``: the key decides whether two requests share K/V
memory. ``hash()`` is 64 bits, randomised per process for str/bytes and trivially collidable for
ints, so two different prefixes could map to one block and a request would silently attend to
another request's K/V (vLLM moved to SHA-256 for the same reason). SHA-256 has no known
collisions and its 32-byte digests are stable across processes and machines, which keeps runs
deterministic.
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

_sha256 = hashlib.sha256
_run_code = struct.Struct("<cqq").pack  # b"R", first id, number of ids
_q = struct.Struct("<q").pack
# ``keys_of``'s steps for a block of consecutive ids, for a caller that inlines the usual case:
# key = sha256(parent + run_code(b"R", first id, block size)).digest()
sha256 = _sha256
run_code = _run_code


def check_token_ids(field: str, token_ids: Sequence[int]) -> None:
    """Refuse ids the keys cannot encode (floats, strings, values outside int64) before
    anything changes: the packing below is the very encoding ``block_code`` uses, done once
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


def block_code(token_ids: Sequence[int]) -> bytes:
    """The canonical encoding of one block's ids (module docstring): ``R`` and the first id
    and count when they are consecutive, ``T`` and every id otherwise."""
    n = len(token_ids)
    if type(token_ids) is TokenRuns:
        runs = token_ids.runs
        if len(runs) == 1:
            return _run_code(b"R", runs[0].start, n)
        token_ids = tuple(token_ids)  # (merged runs are never consecutive; checked anyway)
    if n:
        first = token_ids[0]
        if token_ids[-1] - first == n - 1 and tuple(token_ids) == tuple(range(first, first + n)):
            return _run_code(b"R", first, n)
    return b"T" + struct.pack(f"<{n}q", *token_ids)


def _root(salt: bytes | None) -> bytes:
    """What the first block's code follows: the root key, then the salt if any."""
    return ROOT + b"S" + _q(len(salt)) + salt if salt else ROOT


def hash_block(
    parent: BlockHash | None, token_ids: Sequence[int], salt: bytes | None = None
) -> BlockHash:
    """Key of one full block given its parent's key (``None`` for the first block).

    ``salt`` (for example a per-tenant cache salt) only enters the first block's key; the chain
    carries it to every later block.
    """
    head = _root(salt) if parent is None else parent
    return _sha256(head + block_code(token_ids)).digest()


def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    salt: bytes | None = None,
    parent: BlockHash | None = None,
    max_blocks: int | None = None,
) -> list[BlockHash]:
    """Keys of the consecutive full blocks of ``token_ids`` (a trailing partial block has none).

    Each key is ``hash_block``'s (tests/memory/test_prefix_hash.py checks)."""
    n = len(token_ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    if n <= 0:
        return []
    return keys_of(token_ids, 0, n, block_size, salt, parent)


def keys_of(
    token_ids: Sequence[int],
    j0: int,
    j1: int,
    block_size: int,
    salt: bytes | None = None,
    parent: BlockHash | None = None,
) -> list[BlockHash]:
    """The keys of blocks j0 .. j1 - 1 of ``token_ids`` (each whole), chained from ``parent``
    (the key of block j0 - 1; None: block j0 is a first block). A block inside one run of
    ``TokenRuns`` is coded from the run's bounds, without its ids."""
    keys: list[BlockHash] = []
    if j1 <= j0:
        return keys
    bs = block_size
    head = _root(salt) if parent is None else parent
    sha, append = _sha256, keys.append
    if type(token_ids) is not TokenRuns:
        for j in range(j0, j1):
            head = sha(head + block_code(token_ids[j * bs : (j + 1) * bs])).digest()
            append(head)
        return keys
    runs = token_ids.runs
    last = runs[-1] if runs else range(0)
    pos = len(token_ids) - len(last)
    if j0 * bs >= pos:  # all within the last run (a decoding sequence's new blocks: the usual)
        return run_keys(head, last.start + j0 * bs - pos, j1 - j0, bs)
    j = j0
    pos = 0  # the position of the run's first id
    for r in runs:
        end = pos + len(r)
        if end <= j * bs:
            pos = end
            continue
        while j < j1 and (j + 1) * bs <= end:
            lo = j * bs
            if lo >= pos:  # within this run: consecutive, from its bounds (all up to its end)
                n = min(j1, end // bs) - j
                keys += run_keys(head, r.start + lo - pos, n, bs)
                head = keys[-1]
                j += n
            else:  # it straddles runs: its ids
                head = sha(head + block_code(token_ids[lo : lo + bs])).digest()
                append(head)
                j += 1
        if j >= j1:
            break
        pos = end
    return keys


def run_keys(head: bytes, first: int, n: int, block_size: int) -> list[BlockHash]:
    """The keys of n whole blocks of consecutive ids from ``first`` on, chained from ``head``
    (the parent's key, or the root and salt of ``keys_of``'s first block)."""
    sha, code, bs = _sha256, _run_code, block_size
    keys = []
    for start in range(first, first + n * bs, bs):
        head = sha(head + code(b"R", start, bs)).digest()
        keys.append(head)
    return keys


def iter_keys(
    token_ids: Sequence[int], block_size: int, salt: bytes | None = None
) -> Iterator[BlockHash]:
    """The keys of the whole blocks of ``token_ids`` from the first, one at a time (a prefix
    lookup stops at its first miss)."""
    bs = block_size
    head = _root(salt)
    for j in range(len(token_ids) // bs):
        head = _sha256(head + block_code(token_ids[j * bs : (j + 1) * bs])).digest()
        yield head
