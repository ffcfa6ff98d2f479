"""pagedkv.engine: requests, schedulers, the serving loop, executors, cost models."""
