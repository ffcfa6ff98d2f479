"""The memory layer's configs: one frozen, validated dataclass per allocator family.

Each field's ``metadata["help"]`` is the help text the CLI shows for it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.footprint import BYTES_PER_BLOCK, check_memory
from pagedkv.validation import (
    check_bool,
    check_bounds,
    check_choice,
    check_fraction,
    check_int,
    float_field,
    help_field,
    int_field,
)

MAX_BLOCK_SIZE = 1 << 16
"""Token slots per block: vLLM's block sizes are 8 to 256; a block this large is one per request."""
MAX_BLOCKS = 1 << 30
"""Blocks of one pool; ``pagedkv.footprint`` caps what a run's pools would hold lower still."""
MAX_SLOTS = 1 << 50
"""Token slots of a contiguous address space (C): far above any GPU's, exact in a float."""


class EvictionPolicy(enum.Enum):
    """Which free cached block the prefix cache gives up when an allocation needs one.

    Free blocks that hold no cached prefix are always handed out first, under every policy.
    """

    LRU = "lru"
    """The least recently freed cached block (vLLM's policy)."""
    LFU = "lfu"
    """The cached block with the fewest uses (references taken since it was filled: its
    allocation, every prefix hit, fork or swap-in reuse), ties by least recently freed."""


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache: a pool of GPU blocks, an optional CPU swap pool, prefix caching."""

    num_gpu_blocks: int = int_field(1024, "Physical KV blocks in GPU memory.", 1, MAX_BLOCKS)
    block_size: int = int_field(
        16, "Token slots per block; vLLM's default is 16.", 1, MAX_BLOCK_SIZE
    )
    num_cpu_blocks: int = int_field(
        0, "Blocks in the CPU swap pool; 0 disables swapping.", 0, MAX_BLOCKS
    )
    watermark: float = float_field(
        0.01,
        "Fraction of GPU blocks that admission keeps free, so running sequences can grow "
        "without immediate preemption (vLLM's default 0.01).",
        0.0,
        1.0,
        hi_open=True,
    )
    enable_prefix_caching: bool = help_field(
        False,
        "Cache full blocks by a hash of their tokens and prefix; freed blocks stay cached "
        "until evicted (see eviction_policy).",
    )
    eviction_policy: EvictionPolicy = help_field(
        EvictionPolicy.LRU,
        "Which free cached block prefix caching evicts first: 'lru' (least recently freed) or "
        "'lfu' (fewest uses, ties least recently freed); no effect without prefix caching.",
    )
    enable_pinned_prefixes: bool = help_field(
        False,
        "Explicit prefix sharing: registered prefixes get pinned blocks, shared by reference "
        "count (partial last block included, copied on write); excludes enable_prefix_caching.",
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        check_int("num_gpu_blocks", self.num_gpu_blocks, 1)
        check_int("block_size", self.block_size, 1)
        check_int("num_cpu_blocks", self.num_cpu_blocks, 0)
        check_fraction("watermark", self.watermark)
        check_bool("enable_prefix_caching", self.enable_prefix_caching)
        # Accept the policy's name as a string (from YAML or the CLI) on a frozen dataclass.
        object.__setattr__(
            self,
            "eviction_policy",
            check_choice("eviction_policy", self.eviction_policy, EvictionPolicy),
        )
        check_bool("enable_pinned_prefixes", self.enable_pinned_prefixes)
        blocks = self.num_gpu_blocks + self.num_cpu_blocks
        field = "num_gpu_blocks" if self.num_gpu_blocks >= self.num_cpu_blocks else "num_cpu_blocks"
        check_memory(
            field,
            getattr(self, field),
            f"{blocks} blocks x {BYTES_PER_BLOCK} B",
            blocks * BYTES_PER_BLOCK,
        )
        if self.enable_pinned_prefixes and self.enable_prefix_caching:
            raise ConfigError(
                "enable_pinned_prefixes",
                True,
                "excludes enable_prefix_caching: choose one sharing mechanism "
                "(explicit pinned prefixes, or automatic prefix caching)",
            )

    @property
    def watermark_blocks(self) -> int:
        """Blocks admission keeps free: floor(watermark x num_gpu_blocks)."""
        return int(self.watermark * self.num_gpu_blocks)

    @property
    def capacity(self) -> int:
        """C = num_gpu_blocks x block_size token slots."""
        return self.num_gpu_blocks * self.block_size


class Placement(enum.Enum):
    """Where a contiguous region goes in the linear address space."""

    FIRST_FIT = "first-fit"
    """The lowest-addressed hole that is large enough; holes coalesce when neighbours free."""
    BUDDY = "buddy"
    """Power-of-two blocks that split and merge (the vLLM paper's Orca baseline)."""


class Reservation(enum.Enum):
    """How many slots a contiguous allocator reserves for a request at admission."""

    MAX = "max"
    """max_model_len, whatever the request (Orca (Max))."""
    POW2 = "pow2"
    """The prompt plus the next power of two of the output (at most 2x the output), capped at
    max_model_len (Orca (Pow2), Kwon et al. 2023 §6.1)."""
    ORACLE = "oracle"
    """Exactly prompt + output (Orca (Oracle)); needs the final length up front."""
    SLOTS = "slots"
    """The course lesson's: C // max_model_len equal fixed slots of max_model_len each."""


@dataclass(frozen=True)
class ContiguousConfig:
    """A contiguous baseline: one region per sequence in a linear address space of C slots."""

    capacity: int = int_field(16384, "C: the address space in token slots.", 1, MAX_SLOTS)
    max_model_len: int = int_field(
        2048, "Maximum sequence length (prompt + output) in tokens (<= capacity).", 1, MAX_SLOTS
    )
    placement: Placement = help_field(
        Placement.FIRST_FIT, "Placement: 'first-fit' or 'buddy' ('slots' needs 'first-fit')."
    )
    reservation: Reservation = help_field(
        Reservation.MAX, "Reservation policy: 'max', 'pow2', 'oracle' or 'slots'."
    )
    block_size: int = int_field(
        16,
        "Block size used only to express capacities in blocks for comparison.",
        1,
        MAX_BLOCK_SIZE,
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        check_int("capacity", self.capacity, 1)
        check_int("max_model_len", self.max_model_len, 1)
        check_int("block_size", self.block_size, 1)
        # Accept the policies' names as strings (from YAML or the CLI) on a frozen dataclass.
        object.__setattr__(self, "placement", check_choice("placement", self.placement, Placement))
        object.__setattr__(
            self, "reservation", check_choice("reservation", self.reservation, Reservation)
        )
        if self.max_model_len > self.capacity:
            raise ConfigError(
                "max_model_len",
                self.max_model_len,
                f"must be <= capacity ({self.capacity}): no request of that length could fit",
            )
        if self.max_model_len < self.block_size:
            raise ConfigError(
                "max_model_len", self.max_model_len, f"must be >= block_size ({self.block_size})"
            )
        if self.reservation is Reservation.SLOTS:  # a list entry per slot, priced as a block
            slots = self.num_slots
            check_memory(
                "capacity",
                self.capacity,
                f"{slots} slots x {BYTES_PER_BLOCK} B",
                slots * BYTES_PER_BLOCK,
            )
        if self.reservation is Reservation.SLOTS and self.placement is not Placement.FIRST_FIT:
            raise ConfigError(
                "placement",
                self.placement.value,
                "reservation 'slots' cuts the space into fixed slots; "
                "placement must be 'first-fit'",
            )

    @property
    def num_slots(self) -> int:
        """Fixed slots under the 'slots' reservation: C // max_model_len."""
        return self.capacity // self.max_model_len
