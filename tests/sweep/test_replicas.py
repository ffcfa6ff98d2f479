"""The replica search against synthetic SLO checks with a known answer: the fewest replicas
found exactly, every bracket end simulated, the climb above the guess capped."""

from __future__ import annotations

import math
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from pagedkv.sweep.replicas import MAX_EXTRA_REPLICAS, ReplicaSearch


def _run(search: ReplicaSearch, meets: Callable[[int], bool]) -> ReplicaSearch:
    for _ in range(10_000):  # the search must end long before this
        k = search.next_replicas()
        if k is None:
            return search
        assert all(k != done for done, _ in search.probes)  # never the same count twice
        search.record(k, meets(k))
    raise AssertionError("the replica search did not end")


@given(
    target=st.floats(min_value=1e-3, max_value=1e6),
    capacity=st.floats(min_value=1e-3, max_value=1e3),
    under=st.floats(min_value=0.0, max_value=1.0),
    over=st.floats(min_value=1e-6, max_value=1.0),
)
def test_finds_the_fewest_replicas_from_a_rate_search_answer(
    target: float, capacity: float, under: float, over: float
) -> None:
    # one replica meets the SLOs up to `capacity` req/s; the rate search's answer r* lies at or
    # under it and its lowest failing rate above it, as a bisection leaves them
    sustained, failed = capacity / (1 + under), capacity * (1 + over)
    search = _run(ReplicaSearch.start(target, sustained, failed), lambda k: target / k <= capacity)
    fewest = max(1, math.ceil(target / capacity))
    while fewest > 1 and target / (fewest - 1) <= capacity:  # float rounding of the ceil
        fewest -= 1
    while target / fewest > capacity:
        fewest += 1
    assert search.replicas == fewest
    probed = dict(search.probes)
    assert probed[fewest]
    assert fewest == 1 or probed[fewest - 1] is False  # k - 1 was simulated, and failed
    assert len(search.probes) <= 3 + math.ceil(math.log2(search.guess + 1))


@given(guess=st.integers(1, 10**6), offset=st.integers(-(10**6), 2 * MAX_EXTRA_REPLICAS))
def test_any_monotone_answer_is_found_or_reported_beyond_the_cap(guess: int, offset: int) -> None:
    fewest = max(1, guess + offset)
    search = _run(ReplicaSearch(1e6, guess, None), lambda k: k >= fewest)
    assert search.probes[0] == (guess, guess >= fewest)
    if fewest > guess + MAX_EXTRA_REPLICAS:
        assert search.replicas is None
        assert [k for k, _ in search.probes] == list(range(guess, guess + MAX_EXTRA_REPLICAS + 1))
    else:
        assert search.replicas == fewest
        assert len(search.probes) <= MAX_EXTRA_REPLICAS + 3 + math.ceil(math.log2(guess + 1))


@given(guess=st.integers(1, 200), outcomes=st.lists(st.booleans(), max_size=300))
def test_any_outcomes_end_with_a_pass_above_a_simulated_failure(
    guess: int, outcomes: list[bool]
) -> None:
    # noise: the check need not be monotone; the answer is still a count that passed, one
    # fewer having been simulated and failed (or none)
    answers = iter(outcomes)
    search = _run(ReplicaSearch(50.0, guess, 7.0), lambda k: next(answers, True))
    k = search.replicas
    if k is not None:
        probed = dict(search.probes)
        assert probed[k]
        assert k == 1 or probed[k - 1] is False


def test_a_guess_one_off_costs_two_runs() -> None:
    # the common case: ceil(R / r*) passes and one fewer fails
    search = _run(ReplicaSearch.start(100.0, 9.0, 10.0), lambda k: 100.0 / k <= 9.05)
    assert search.probes == [(12, True), (11, False)]
    assert search.replicas == 12
