"""pagedkv.memory: the books. Pure Python; importing it never imports torch."""
