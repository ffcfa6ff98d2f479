"""What the fuzz (tests/test_fuzz_configs.py) found, each as a minimal reproducer, kept as a
regression test now that each is fixed."""

from __future__ import annotations

from tests.engine.test_fast_forward import same
from tests.test_fuzz_configs import run_both


def test_chunked_budget_below_a_prompt_of_one_output_token() -> None:
    """A 17-token prompt, one output token, chunked prefill with a budget of 16: the fast path
    once took the last prompt token for a decode and recorded no first token time."""
    flat = {
        "workload": "fixed",
        "num_requests": 1,
        "prompt_len": 17,
        "output_len": 1,
        "max_model_len": 64,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 16,
        "max_num_seqs": 1,
        "num_gpu_blocks": 48,
        "block_size": 1,
        "cost_model": "unit",
    }
    both = run_both(flat)
    assert both is not None
    fast, ref = both
    same(fast.requests, ref.requests)
    assert fast.requests[0]["first_token_time"] is not None


def test_a_swap_in_made_cheaper_by_prefix_caching_inside_a_window() -> None:
    """Once a gap of the fast path, as the fuzz found it: pairs of equal requests (two samples run
    as requests), prefix caching, swap preemption. At t = 27 request 10 decodes while its twin
    11 is swapped out; each block 10 fills gets the key of one of 11's swapped blocks, so
    11's swap-in needs fewer free blocks each round. The reference resumes 11 before t = 38;
    the fast path ran 10 alone through one window to t = 38 (mean_running 3.0 vs 3.025). With
    prefix caching and a request queued, the fast path now steps round by round."""
    flat = {
        "workload": "shared-prefix",
        "seed": 0,
        "num_requests": 7,
        "prefix_len": 1,
        "lengths": "uniform",
        "min_prompt_len": 1,
        "max_prompt_len": 20,
        "min_output_len": 1,
        "max_output_len": 20,
        "num_prefixes": 1,
        "share_ratio": 0.0,
        "num_samples": 2,
        "samples_as_requests": True,
        "max_model_len": 48,
        "scheduler": "vllm",
        "block_size": 4,
        "num_gpu_blocks": 15,
        "swap_space": 4.0,
        "watermark": 0.0,
        "cost_model": "unit",
        "preemption_mode": "swap",
        "enable_prefix_caching": True,
    }
    both = run_both(flat)
    assert both is not None
    fast, ref = both
    same(fast.summary, ref.summary)


def test_chunked_prefill_first_token_time() -> None:
    """The same bug without the assertion: two requests of a 33-token prompt and 275
    outputs, chunked prefill with a budget of 33; the fast path once recorded the second
    request's first token when the first finished (280) rather than at 3."""
    flat = {
        "workload": "fixed",
        "num_requests": 2,
        "prompt_len": 33,
        "output_len": 275,
        "max_model_len": 400,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 33,
        "max_num_seqs": 3,
        "num_gpu_blocks": 400,
        "block_size": 1,
        "cost_model": "unit",
    }
    both = run_both(flat)
    assert both is not None
    fast, ref = both
    same(fast.requests, ref.requests)
