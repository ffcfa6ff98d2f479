"""What a run would hold in memory, estimated before it holds it, against one stated cap.

Some values size what a run allocates: the blocks of the GPU and CPU pools (one entry per block
in several tables), the requests (a spec, a request, its record), the token ids of the sharing
workloads (a tuple entry per token). A value that passes its field's bounds can still ask for
more memory than a machine has, and the failure would then come late, as a ``MemoryError`` or
the kernel killing the process. So each such count is priced in bytes and the total checked
against ``MEMORY_CAP_BYTES`` first, with one ``ConfigError`` naming the value.

The prices are upper bounds of what CPython 3.11 takes, measured with ``tracemalloc``
(``tests/test_footprint.py`` measures them again and checks they still bound it):

* a block (of the GPU or CPU pool): about 105 bytes (a ref count, a hash slot, a free-queue
  entry and its int);
* a request through a whole simulated run (spec, request, record): 1.4 to 1.6 KB;
* a token id: 40 bytes when new (an int object and a tuple slot), 8 bytes when a tuple repeats
  ids another tuple holds (a chat turn's conversation so far).
"""

from __future__ import annotations

from pagedkv.errors import ConfigError

GiB = 1 << 30
MEMORY_CAP_BYTES = 4 * GiB
"""The most one run may plan to hold: half a laptop's memory, far above any workload of the paper
(a few thousand requests, about 10^5 blocks, a few MB)."""
BYTES_PER_BLOCK = 256
BYTES_PER_REQUEST = 2048
BYTES_PER_TOKEN_ID = 40
BYTES_PER_REPEATED_ID = 8


def check_memory(field: str, value: object, what: str, nbytes: int) -> None:
    """Refuse ``value`` of ``field`` when what it makes the run hold (``what``: the count and
    its unit, for the message) is over ``MEMORY_CAP_BYTES``."""
    if nbytes > MEMORY_CAP_BYTES:
        raise ConfigError(
            field,
            value,
            f"must keep a run within {_size(MEMORY_CAP_BYTES)} of memory (pagedkv.footprint); "
            f"it would hold about {_size(nbytes)} ({what})",
        )


def run_bytes(num_blocks: int, num_requests: int) -> int:
    """The estimate for ``num_blocks`` pool blocks (GPU + CPU) and ``num_requests`` requests."""
    return num_blocks * BYTES_PER_BLOCK + num_requests * BYTES_PER_REQUEST


def token_id_bytes(new_ids: int, repeated_ids: int = 0) -> int:
    """The estimate for ``new_ids`` token ids made and ``repeated_ids`` referenced again."""
    return new_ids * BYTES_PER_TOKEN_ID + repeated_ids * BYTES_PER_REPEATED_ID


def _size(nbytes: int) -> str:
    return f"{nbytes / GiB:.3g} GiB" if nbytes >= GiB else f"{nbytes / (1 << 20):.3g} MiB"
