"""WorkloadConfig: which requests a run serves, and when they arrive.

One frozen, validated dataclass (like the memory layer's configs): every field has help text,
strings are accepted for the choices (from YAML or the CLI), and an inconsistent combination is
rejected at construction with one ``ConfigError`` naming the field at fault.
"""

from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass

from pagedkv.errors import ConfigError
from pagedkv.footprint import BYTES_PER_REQUEST, check_memory
from pagedkv.validation import (
    check_bool,
    check_bounds,
    check_choice,
    check_int,
    float_field,
    help_field,
    int_field,
)
from pagedkv.workloads.arrivals import Arrival, check_rate
from pagedkv.workloads.lesson import LESSON
from pagedkv.workloads.token_ids import SPAN

DEFAULT_NUM_REQUESTS = 1000
"""Requests of a synthetic workload unless told: vLLM's serving benchmark's ``--num-prompts``
default (``benchmarks/benchmark_serving.py``)."""

LESSON_MAX_REQUESTS = 50
"""The lesson's request i has 50 - i output tokens (``lesson.py``), so at most 50 requests."""

MAX_TOKENS = SPAN
"""The longest request, in tokens (max_model_len and every length field): the token ids of one
owner span ``token_ids.SPAN`` = 2^24, more than any model's context."""
MAX_REQUESTS = 1 << 24
"""The most requests (and sessions, prefixes) a workload may ask for; ``pagedkv.footprint`` caps
what they would hold lower still."""
MAX_SAMPLES = 1024
"""The most parallel samples or beams per request."""
MAX_SEED = 2**64 - 1
MAX_RATE = 1e9
"""Requests per second: a nanosecond apart; ``MIN_RATE`` = 1e-9 is one every 32 years."""
MIN_RATE = 1e-9

TRACE_SUFFIXES = (".jsonl", ".csv", ".json")
"""Our trace formats (``trace.py``), and ``.json`` for a ShareGPT-format file."""


class WorkloadKind(enum.Enum):
    """Where the requests' lengths come from."""

    LESSON = "lesson"
    """The course lesson's 20 requests (``lesson.py``)."""
    SHAREGPT_LIKE = "sharegpt-like"
    """Lognormal lengths with ShareGPT's means (``synthetic.SHAREGPT_LIKE``)."""
    ALPACA_LIKE = "alpaca-like"
    """Lognormal lengths with Alpaca's means (``synthetic.ALPACA_LIKE``)."""
    FIXED = "fixed"
    """Every request has prompt_len and output_len tokens."""
    UNIFORM = "uniform"
    """Lengths uniform over [min, max] (integers, both included) on each side."""
    TRACE = "trace"
    """A trace file (.jsonl or .csv, see ``trace.py``) or a ShareGPT-format .json file."""
    SHARED_PREFIX = "shared-prefix"
    """K shared prefixes (system prompts, few-shot examples) before each prompt
    (``shared_prefix.py``)."""
    CHAT = "chat"
    """Multi-turn chat sessions: each turn's prompt is the conversation so far (``chat.py``)."""
    TRANSLATION = "translation"
    """The vLLM paper's shared-prefix case: a 1-shot or 5-shot translation prompt
    (``shared_prefix.py``)."""
    SHAREGPT = "sharegpt"
    """A ShareGPT-format .json file read as ``vllm bench serve --dataset-name sharegpt`` reads
    it: each conversation's first turn and the next one's length (``sharegpt.py``)."""
    RANDOM = "random"
    """``vllm bench serve --dataset-name random``: lengths uniform around random_input_len and
    random_output_len, after one shared prefix of random_prefix_len tokens
    (``random_dataset.py``)."""


class SuffixLengths(enum.Enum):
    """Where the lengths after a shared prefix (and the outputs) come from, for the sharing
    kinds: the synthetic kinds' models, with the same fields for 'fixed' and 'uniform'."""

    SHAREGPT_LIKE = "sharegpt-like"
    ALPACA_LIKE = "alpaca-like"
    FIXED = "fixed"
    UNIFORM = "uniform"


SHARING_KINDS = (
    WorkloadKind.SHARED_PREFIX,
    WorkloadKind.CHAT,
    WorkloadKind.TRANSLATION,
    WorkloadKind.RANDOM,
)
"""The kinds whose requests carry token ids (so prefix caching can find what they share)."""
TRANSLATION_PREFIX_LENS = {1: 80, 5: 341}
"""Shots -> prefix tokens of the vLLM paper's translation case (Kwon et al., SOSP'23, §6.3,
Fig. 16: a 1-shot prefix of 80 tokens and a 5-shot prefix of 341 tokens)."""
VLLM_RANDOM_DEFAULTS = {
    "random_input_len": 1024,
    "random_output_len": 128,
    "random_range_ratio": 0.0,
    "random_prefix_len": 0,
}
"""``vllm bench serve``'s defaults for its random dataset (``RandomDataset`` in
``vllm/benchmarks/datasets/random.py``: DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, DEFAULT_RANGE_RATIO,
DEFAULT_PREFIX_LEN)."""
FILE_KINDS = (WorkloadKind.TRACE, WorkloadKind.SHAREGPT)
"""The kinds read from a file (``trace_path``, vLLM's ``dataset_path``)."""
DEFAULT_NUM_SESSIONS = 100
DEFAULT_CHAT_TURNS = 4
DEFAULT_THINK_TIME = 5.0


_FIXED_FIELDS = ("prompt_len", "output_len")
_UNIFORM_FIELDS = ("min_prompt_len", "max_prompt_len", "min_output_len", "max_output_len")


@dataclass(frozen=True)
class WorkloadConfig:
    """A workload: the kind of lengths, how many requests, the seed, the arrival process."""

    kind: WorkloadKind = help_field(
        WorkloadKind.LESSON,
        "Workload: 'lesson', 'sharegpt-like', 'alpaca-like', 'fixed', 'uniform', 'trace', "
        "'shared-prefix', 'chat', 'translation', or vllm bench serve's datasets 'sharegpt' "
        "(a ShareGPT .json file, --dataset-path) and 'random'.",
    )
    num_requests: int | None = int_field(
        None,
        f"Requests (>= 1). Default: the lesson's 20, every request of a trace, "
        f"{DEFAULT_NUM_REQUESTS} for a synthetic kind and 'sharegpt' (vLLM's --num-prompts "
        f"default); the lesson has at most {LESSON_MAX_REQUESTS}; a trace keeps its first "
        "num_requests; 'sharegpt' repeats pairs drawn at random if the file has too few.",
        1,
        MAX_REQUESTS,
    )
    seed: int = int_field(
        0,
        "Seed of every random draw: lengths and arrivals use independent streams.",
        0,
        MAX_SEED,
    )
    arrival: Arrival | None = help_field(
        None,
        "Arrival process: 'all-at-once' (t = 0), 'poisson' or 'gamma' (both need "
        "request_rate). Default: all at t = 0, except 'trace' which keeps the file's times.",
    )
    request_rate: float | None = float_field(
        None,
        "Mean arrival rate in requests per second, for 'poisson' and 'gamma' (as a flag or a "
        "config key given alone it means 'poisson', or 'gamma' with a burstiness other than "
        "1; there 'inf', vLLM's default, means arrival 'all-at-once').",
        MIN_RATE,
        MAX_RATE,
    )
    burstiness: float = float_field(
        1.0,
        "vLLM's --burstiness: the shape k of the gamma inter-arrival times (> 0; coefficient "
        "of variation 1/sqrt(k)): 1 is Poisson, below 1 burstier, above 1 more regular. Only "
        "'gamma' may set it to other than 1.",
        1e-6,
        1e6,
    )
    max_concurrency: int | None = int_field(
        None,
        "vllm bench serve's --max-concurrency: a closed-loop client that sends a request only "
        "while fewer than N are in flight (sent, not finished); it waits otherwise, and its "
        "TTFT and E2E count from when it is sent. Default: no cap.",
        1,
        MAX_REQUESTS,
    )
    prompt_len: int | None = int_field(
        None, "Prompt tokens of every request (kind 'fixed').", 1, MAX_TOKENS
    )
    output_len: int | None = int_field(
        None, "Output tokens of every request (kind 'fixed').", 1, MAX_TOKENS
    )
    min_prompt_len: int | None = int_field(
        None, "Smallest prompt length (kind 'uniform').", 1, MAX_TOKENS
    )
    max_prompt_len: int | None = int_field(
        None, "Largest prompt length (kind 'uniform').", 1, MAX_TOKENS
    )
    min_output_len: int | None = int_field(
        None, "Smallest output length (kind 'uniform').", 1, MAX_TOKENS
    )
    max_output_len: int | None = int_field(
        None, "Largest output length (kind 'uniform').", 1, MAX_TOKENS
    )
    trace_path: str | None = help_field(
        None,
        "Trace file (kind 'trace'): .jsonl or .csv, or a ShareGPT-format .json; for kind "
        "'sharegpt' the ShareGPT .json (vLLM's --dataset-path).",
    )
    tokenizer: str | None = help_field(
        None,
        "A local Hugging Face tokenizer directory (its tokenizer.json, read by the "
        "'tokenizers' library) that counts a ShareGPT file's tokens (kinds 'sharegpt' and "
        "'trace' with a .json); without one a text of c characters counts ceil(c / 4).",
    )
    random_input_len: int | None = int_field(
        None,
        "Kind 'random': mean input tokens after the prefix (vLLM's --random-input-len, "
        "default 1024); drawn uniformly from [floor(L(1 - r)), ceil(L(1 + r))].",
        0,
        MAX_TOKENS,
    )
    random_output_len: int | None = int_field(
        None,
        "Kind 'random': mean output tokens (vLLM's --random-output-len, default 128); drawn "
        "uniformly from [max(1, floor(L(1 - r))), ceil(L(1 + r))].",
        1,
        MAX_TOKENS,
    )
    random_range_ratio: float | None = float_field(
        None,
        "Kind 'random': r in [0, 1), the half-width of both length ranges as a fraction of "
        "their means (vLLM's --random-range-ratio, default 0: fixed lengths).",
        0.0,
        1.0,
        hi_open=True,
    )
    random_prefix_len: int | None = int_field(
        None,
        "Kind 'random': tokens of one prefix every prompt starts with, before its input "
        "(vLLM's --random-prefix-len, default 0); shared, so prefix caching can find it.",
        0,
        MAX_TOKENS,
    )
    max_model_len: int = int_field(
        2048,
        "Maximum sequence length: longer requests are cut to prompt + output <= this "
        "(the vLLM paper's 2048).",
        2,
        MAX_TOKENS,
    )
    prefix_len: int | None = int_field(
        None,
        "Tokens of each shared prefix (<= max_model_len - 2): needed by 'shared-prefix'; "
        "for 'chat' an optional system prompt every session starts with.",
        1,
        MAX_TOKENS,
    )
    num_prefixes: int | None = int_field(
        None, "Distinct shared prefixes K (kind 'shared-prefix', default 1).", 1, MAX_REQUESTS
    )
    share_ratio: float | None = float_field(
        None,
        "Fraction of requests that start with a shared prefix, in [0, 1] (kinds "
        "'shared-prefix' and 'translation', default 1); the others start with a private "
        "prefix of the same length, so the load does not depend on it.",
        0.0,
        1.0,
    )
    prefix_zipf: float | None = float_field(
        None,
        "Zipf exponent of the prefixes' popularity (0: uniform; kind 'shared-prefix', "
        "default 1): prefix k is chosen with probability proportional to 1 / (k + 1)^a.",
        0.0,
        100.0,
    )
    lengths: SuffixLengths | None = help_field(
        None,
        "Lengths after the prefix and of the outputs (kinds 'shared-prefix', 'chat'): "
        "'sharegpt-like', 'alpaca-like', 'fixed' or 'uniform' (with their length fields). "
        "Default: 'sharegpt-like' for shared-prefix, 'alpaca-like' for chat.",
    )
    shots: int | None = int_field(
        None,
        "Translation examples in the shared prompt (kind 'translation'): 1 (an 80-token "
        "prefix) or 5 (341 tokens), as in the vLLM paper's §6.3. Default 1.",
        1,
        5,
    )
    num_sessions: int | None = int_field(
        None, f"Chat sessions (kind 'chat', default {DEFAULT_NUM_SESSIONS}).", 1, MAX_REQUESTS
    )
    chat_turns: int | None = int_field(
        None, f"Turns per chat session (kind 'chat', default {DEFAULT_CHAT_TURNS}).", 1, 1 << 16
    )
    num_samples: int = int_field(
        1,
        "Parallel samples per request: n sequences share the prompt's K/V and fork "
        "after the prefill (paged policies only; contiguous ones refuse such requests).",
        1,
        MAX_SAMPLES,
    )
    beam_width: int = int_field(
        1,
        "Beam search width per request (1: none): k beams share the prompt's K/V and "
        "fork or die after every token by a seeded survival model (paged policies only; "
        "exclusive with num_samples).",
        1,
        MAX_SAMPLES,
    )
    samples_as_requests: bool = help_field(
        False,
        "Run each request's num_samples / beam_width sequences as that many independent "
        "requests, each with the full prompt (nothing shared): the no-sharing baseline that "
        "contiguous policies can run.",
    )
    think_time_mean: float | None = float_field(
        None,
        "Mean seconds between a turn's answer and the next turn (exponential; kind "
        f"'chat', default {DEFAULT_THINK_TIME}).",
        0.0,
        1e9,
    )

    def __post_init__(self) -> None:
        kind = check_choice("kind", self.kind, WorkloadKind)
        object.__setattr__(self, "kind", kind)
        check_bounds(self)
        if self.arrival is not None:
            object.__setattr__(self, "arrival", check_choice("arrival", self.arrival, Arrival))
        check_int("seed", self.seed, 0)
        check_int("num_samples", self.num_samples, 1)
        check_int("beam_width", self.beam_width, 1)
        check_bool("samples_as_requests", self.samples_as_requests)
        if self.samples_as_requests and kind is WorkloadKind.CHAT:
            raise ConfigError(
                "samples_as_requests",
                True,
                "must be false for kind 'chat' (a turn's follow-up names one request)",
            )
        if self.num_samples > 1 and self.beam_width > 1:
            raise ConfigError(
                "beam_width",
                self.beam_width,
                f"must be 1 when num_samples = {self.num_samples} (parallel sampling and beam "
                "search are exclusive)",
            )
        check_int("max_model_len", self.max_model_len, 2)
        if self.max_concurrency is not None:
            check_int("max_concurrency", self.max_concurrency, 1)
        if self.num_requests is None and kind in (WorkloadKind.RANDOM, WorkloadKind.SHAREGPT):
            object.__setattr__(self, "num_requests", DEFAULT_NUM_REQUESTS)  # vLLM's default
        self._check_random()
        if self.num_requests is not None:
            check_int("num_requests", self.num_requests, 1)
            if kind is WorkloadKind.LESSON and self.num_requests > LESSON_MAX_REQUESTS:
                raise ConfigError(
                    "num_requests",
                    self.num_requests,
                    f"must be <= {LESSON_MAX_REQUESTS} for 'lesson' (request i has 50 - i "
                    "output tokens)",
                )
        self._check_arrival()
        self._check_sharing()
        self._only_for(WorkloadKind.FIXED, _FIXED_FIELDS)
        self._only_for(WorkloadKind.UNIFORM, _UNIFORM_FIELDS)
        if self.trace_path is not None and kind not in FILE_KINDS:
            raise ConfigError(
                "trace_path",
                self.trace_path,
                f"is only used by kind 'trace' and 'sharegpt', not {kind.value!r}",
            )
        if kind is WorkloadKind.FIXED or self.lengths is SuffixLengths.FIXED:
            self._check_fixed()
        elif kind is WorkloadKind.UNIFORM or self.lengths is SuffixLengths.UNIFORM:
            self._check_uniform()
        elif kind in FILE_KINDS:
            self._check_trace()
        self._check_tokenizer()
        planned = self.planned_requests
        if planned is not None:
            field = "num_sessions" if kind is WorkloadKind.CHAT else "num_requests"
            check_memory(
                field,
                getattr(self, field),
                f"{planned} requests x {BYTES_PER_REQUEST} B",
                planned * BYTES_PER_REQUEST,
            )

    @property
    def planned_requests(self) -> int | None:
        """The requests the run will serve, as the config says (None for a trace: its lines)."""
        if self.kind is WorkloadKind.TRACE:
            return None
        if self.kind is WorkloadKind.CHAT:
            n = (self.num_sessions or DEFAULT_NUM_SESSIONS) * (
                self.chat_turns or DEFAULT_CHAT_TURNS
            )
        elif self.num_requests is not None:
            n = self.num_requests
        else:
            n = LESSON.num_requests if self.kind is WorkloadKind.LESSON else DEFAULT_NUM_REQUESTS
        width = max(self.num_samples, self.beam_width)
        return n * width if self.samples_as_requests else n

    def _check_random(self) -> None:
        """Kind 'random': vLLM's defaults for the fields not given, then its checks; the
        fields belong to that kind alone."""
        names = tuple(VLLM_RANDOM_DEFAULTS)
        if self.kind is not WorkloadKind.RANDOM:
            for name in names:
                if getattr(self, name) is not None:
                    raise ConfigError(
                        name,
                        getattr(self, name),
                        f"is only used by kind 'random', not {self.kind.value!r}",
                    )
            return
        for name, default in VLLM_RANDOM_DEFAULTS.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        prefix, (lo_in, _), (lo_out, _) = self.random_prefix_len, *self.random_ranges
        assert isinstance(prefix, int)
        if prefix + lo_in < 1:
            raise ConfigError(
                "random_input_len",
                self.random_input_len,
                "with random_prefix_len 0, floor(random_input_len x (1 - random_range_ratio)) "
                "must be >= 1: a prompt needs a token",
            )
        if prefix > self.max_model_len - 2:
            raise ConfigError(
                "random_prefix_len",
                prefix,
                f"must be <= max_model_len - 2 ({self.max_model_len - 2}): a prompt needs a "
                "token of its own and a request an output token",
            )
        if prefix + max(lo_in, 1) + lo_out > self.max_model_len:
            raise ConfigError(
                "random_input_len",
                self.random_input_len,
                f"the shortest request (prefix + input + output) must fit max_model_len "
                f"({self.max_model_len}): every request would be cut",
            )

    @property
    def random_ranges(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """Kind 'random': the input and output length ranges, both ends included, as vLLM's
        RandomDataset.get_sampling_params draws them: [floor(L(1 - r)), ceil(L(1 + r))], the
        output's lower end at least 1 (vLLM subtracts its tokenizer's special tokens from the
        input length first; without a tokenizer there are none)."""
        i, o = self.random_input_len, self.random_output_len
        r = self.random_range_ratio
        if i is None or o is None or r is None:
            raise ValueError("random_ranges is only defined for kind 'random'")
        inputs = (math.floor(i * (1 - r)), math.ceil(i * (1 + r)))
        outputs = (max(1, math.floor(o * (1 - r))), max(1, math.ceil(o * (1 + r))))
        return inputs, outputs

    def _check_tokenizer(self) -> None:
        if self.tokenizer is None:
            return
        json_file = self.kind is WorkloadKind.TRACE and str(self.trace_path).endswith(".json")
        if self.kind is not WorkloadKind.SHAREGPT and not json_file:
            raise ConfigError(
                "tokenizer",
                self.tokenizer,
                "counts a ShareGPT file's tokens: only for kind 'sharegpt' or a .json trace",
            )
        if not isinstance(self.tokenizer, (str, os.PathLike)):
            raise ConfigError("tokenizer", self.tokenizer, "must be a path to a directory")
        object.__setattr__(self, "tokenizer", os.fspath(self.tokenizer))

    def _check_arrival(self) -> None:
        timed = self.arrival in (Arrival.POISSON, Arrival.GAMMA)
        if timed:
            if self.request_rate is None:
                raise ConfigError(
                    "request_rate", None, f"arrival {self.arrival_name!r} needs a request rate > 0"
                )
            check_rate("request_rate", self.request_rate)
        elif self.request_rate is not None:
            raise ConfigError(
                "request_rate",
                self.request_rate,
                f"is only used by arrival 'poisson' or 'gamma', not {self.arrival_name!r}",
            )
        check_rate("burstiness", self.burstiness)
        if self.burstiness != 1.0 and self.arrival is not Arrival.GAMMA:
            raise ConfigError(
                "burstiness",
                self.burstiness,
                f"must be 1 unless arrival is 'gamma' (arrival is {self.arrival_name!r})",
            )

    @property
    def arrival_name(self) -> str:
        """The arrival process's name, or 'default' when the kind's own applies."""
        return "default" if self.arrival is None else self.arrival.value

    def _only_for(self, kind: WorkloadKind, fields: tuple[str, ...]) -> None:
        if self.kind is kind or (self.lengths is not None and self.lengths.value == kind.value):
            return  # a sharing kind with lengths 'fixed' or 'uniform' uses their fields
        for name in fields:
            value = getattr(self, name)
            if value is not None:
                raise ConfigError(
                    name, value, f"is only used by kind {kind.value!r}, not {self.kind.value!r}"
                )

    def _check_fixed(self) -> None:
        prompt = _require_int(self, "prompt_len", 1)
        output = _require_int(self, "output_len", 1)
        if prompt + output > self.max_model_len:
            raise ConfigError(
                "output_len",
                output,
                f"prompt_len + output_len must be <= max_model_len ({self.max_model_len})",
            )

    def _check_uniform(self) -> None:
        lo_p, hi_p, lo_o, hi_o = (_require_int(self, name, 1) for name in _UNIFORM_FIELDS)
        check_int("max_prompt_len", hi_p, lo_p)
        check_int("max_output_len", hi_o, lo_o)
        if lo_p + lo_o > self.max_model_len:
            raise ConfigError(
                "min_output_len",
                lo_o,
                f"min_prompt_len + min_output_len must be <= max_model_len "
                f"({self.max_model_len}): every request would be cut",
            )

    def _check_trace(self) -> None:
        path = self.trace_path
        if path is None:
            raise ConfigError(
                "trace_path", None, f"kind {self.kind.value!r} needs a file (--dataset-path)"
            )
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError("trace_path", path, "must be a path")
        text = os.fspath(path)
        suffixes = TRACE_SUFFIXES if self.kind is WorkloadKind.TRACE else (".json",)
        if not isinstance(text, str) or not text.endswith(suffixes):
            raise ConfigError("trace_path", path, "must end in " + ", ".join(suffixes))
        object.__setattr__(self, "trace_path", text)

    def _check_sharing(self) -> None:
        """The sharing kinds' fields: each only for its kinds, then their values."""
        kind = self.kind
        shared, chat = WorkloadKind.SHARED_PREFIX, WorkloadKind.CHAT
        translation = WorkloadKind.TRANSLATION
        for name, kinds in (
            ("prefix_len", (shared, chat)),
            ("num_prefixes", (shared,)),
            ("share_ratio", (shared, translation)),
            ("prefix_zipf", (shared,)),
            ("lengths", (shared, chat)),
            ("shots", (translation,)),
            ("num_sessions", (chat,)),
            ("chat_turns", (chat,)),
            ("think_time_mean", (chat,)),
        ):
            value = getattr(self, name)
            if value is not None and kind not in kinds:
                allowed = " and ".join(repr(k.value) for k in kinds)
                raise ConfigError(
                    name, value, f"is only used by kind {allowed}, not {kind.value!r}"
                )
        if self.lengths is not None:
            object.__setattr__(
                self, "lengths", check_choice("lengths", self.lengths, SuffixLengths)
            )
        if kind is shared and self.prefix_len is None:
            raise ConfigError("prefix_len", None, "kind 'shared-prefix' needs prefix_len")
        if self.prefix_len is not None:
            check_int("prefix_len", self.prefix_len, 1)
            if self.prefix_len > self.max_model_len - 2:
                raise ConfigError(
                    "prefix_len",
                    self.prefix_len,
                    f"must be <= max_model_len - 2 ({self.max_model_len - 2}): a prompt needs a "
                    "token of its own and a request an output token",
                )
        if self.num_prefixes is not None:
            check_int("num_prefixes", self.num_prefixes, 1)
        for name in ("share_ratio", "prefix_zipf", "think_time_mean"):
            value = getattr(self, name)
            top = 1.0 if name == "share_ratio" else math.inf
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= top
                or math.isinf(value)
            ):
                allowed = "a number in [0, 1]" if name == "share_ratio" else "a finite number >= 0"
                raise ConfigError(name, value, "must be " + allowed)
        if self.shots is not None and self.shots not in TRANSLATION_PREFIX_LENS:
            raise ConfigError("shots", self.shots, "must be 1 or 5 (the vLLM paper's two prefixes)")
        if (
            kind is translation
            and TRANSLATION_PREFIX_LENS[self.shots or 1] > self.max_model_len - 2
        ):
            raise ConfigError(
                "max_model_len", self.max_model_len, "is too short for the translation prefix"
            )
        if self.num_sessions is not None:
            check_int("num_sessions", self.num_sessions, 1)
        if self.chat_turns is not None:
            check_int("chat_turns", self.chat_turns, 1)
        if kind is chat and self.num_requests is not None:
            raise ConfigError(
                "num_requests",
                self.num_requests,
                "must be unset for kind 'chat': it serves num_sessions x chat_turns requests",
            )

    @property
    def suffix_lengths(self) -> SuffixLengths:
        """The lengths model after the prefix: ``lengths`` or the kind's default."""
        if self.lengths is not None:
            return self.lengths
        if self.kind is WorkloadKind.CHAT:
            return SuffixLengths.ALPACA_LIKE
        return SuffixLengths.SHAREGPT_LIKE


def _require_int(config: WorkloadConfig, name: str, minimum: int) -> int:
    value = getattr(config, name)
    if value is None:
        raise ConfigError(name, None, f"kind {config.kind.value!r} needs {name}")
    return check_int(name, value, minimum)
