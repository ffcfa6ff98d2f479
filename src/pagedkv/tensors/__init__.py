"""pagedkv.tensors: the real thing, in torch.

``kv_cache`` holds the paged K/V tensors (``[num_blocks, block_size, kv_heads, head_dim]`` per
layer, plus a CPU swap pool) and performs the writes, copy-on-write copies and swaps that
``pagedkv.memory`` decides; ``attention`` computes paged attention over them (reference and fast
paths, grouped-query attention).

This package imports torch. ``pagedkv.memory`` and ``pagedkv.engine`` never import it: the books
and the scheduler stay pure Python, and the real executor plugs in through the executor interface.
"""
