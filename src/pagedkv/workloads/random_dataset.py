"""Kind 'random': ``vllm bench serve --dataset-name random``'s lengths, with its shared prefix.

vLLM's ``RandomDataset`` (``vllm/benchmarks/datasets/random.py``, ``get_sampling_params``
and ``sample``) draws each request's input length uniformly from the integers
[floor(L_in (1 - r)), ceil(L_in (1 + r))] and its output length from [max(1, floor(L_out
(1 - r))), ceil(L_out (1 + r))], r = ``random_range_ratio`` in [0, 1) (``WorkloadConfig.
random_ranges``), and puts one prefix of ``random_prefix_len`` random tokens, the same for every
request, before each input. Here, every draw from the seed:

1. Lengths: n prompts prefix + input from the PROMPT stream and n outputs from the OUTPUT
   stream (``synthetic.LengthModel`` of two ``Uniform``); vLLM draws from one generator.
2. Arrivals: all at t = 0 unless ``arrival`` is set (the ARRIVALS stream, as every kind).
3. Capping: prompt <= max_model_len - 1 by cutting the input, then the output to what is left
   (vLLM's server would refuse a request over its max_model_len instead).
4. Ids (``token_ids.py``), only with a prefix: the shared prefix 0's ids, then the request's
   own (vLLM's inputs are distinct runs of the vocabulary, so only the prefix is shared);
   ``extra`` carries ``prefix_id`` 0 and ``prefix_len``. Without a prefix there is nothing to
   share and the requests carry no ids.
"""

from __future__ import annotations

from pagedkv.workloads.config import WorkloadConfig, WorkloadKind
from pagedkv.workloads.shared_prefix import start_times
from pagedkv.workloads.spec import RequestSpec, columns_pass
from pagedkv.workloads.synthetic import LengthModel, Uniform
from pagedkv.workloads.token_ids import check_ids, own_ids, prefix_ids


def random_length_model(config: WorkloadConfig) -> LengthModel:
    """Prompt (prefix + input) and output lengths of kind 'random', uncapped."""
    if config.kind is not WorkloadKind.RANDOM or config.random_prefix_len is None:
        raise ValueError(f"kind {config.kind.value!r} is not 'random'")
    (lo_in, hi_in), (lo_out, hi_out) = config.random_ranges
    prefix = config.random_prefix_len
    return LengthModel(Uniform(prefix + lo_in, prefix + hi_in), Uniform(lo_out, hi_out))


def random_workload(config: WorkloadConfig) -> list[RequestSpec]:
    """The requests of kind 'random' (see the module docstring), ids 0..n-1 by arrival."""
    n = int(config.num_requests or 0)  # the config fills vLLM's default 1000
    prefix = int(config.random_prefix_len or 0)
    prompts, outputs = random_length_model(config).sample(n, config.seed)
    times = start_times(config, n)
    max_len = config.max_model_len
    prompts = [min(p, max_len - 1) for p in prompts]  # the config keeps prefix <= max_len - 2
    outputs = [min(o, max_len - p) for p, o in zip(prompts, outputs, strict=True)]
    if prefix:
        check_ids("num_requests", n, sum(prompts) + sum(outputs))  # before any id is made
    extra = (("prefix_id", "0"), ("prefix_len", str(prefix))) if prefix else ()
    # Lengths and times checked in bulk, ids made to the lengths: each spec checked once.
    make = RequestSpec.checked_already if columns_pass(prompts, outputs, times) else RequestSpec
    specs = []
    for r in range(n):
        prompt, output = prompts[r], outputs[r]
        ids = out_ids = None
        if prefix:
            ids = prefix_ids(0, prefix) + own_ids(r, 0, prompt - prefix)
            out_ids = own_ids(r, prompt - prefix, output)
        specs.append(
            make(
                request_id=r,
                prompt_len=prompt,
                output_len=output,
                arrival_time=times[r],
                extra=extra,
                token_ids=ids,
                output_token_ids=out_ids,
            )
        )
    return specs
