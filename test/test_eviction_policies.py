from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csr_ros.errors import ConfigError
from csr_ros.eviction import drop_oldest_fraction, keep_recent_tokens, make_policy


def test_dropping_the_oldest_half_rounds_up():
    assert drop_oldest_fraction([10] * 5) == 3
    assert drop_oldest_fraction([10] * 4) == 2
    assert drop_oldest_fraction([]) == 0


def test_keep_recent_tokens_drops_the_fewest_oldest_chunks():
    assert keep_recent_tokens([5, 5, 5, 5], 10) == 2
    assert keep_recent_tokens([5, 5, 5, 5], 11) == 2
    assert keep_recent_tokens([5, 5, 5, 5], 100) == 0
    assert keep_recent_tokens([5, 5, 5, 5], 0) == 4


@given(st.lists(st.integers(1, 500), max_size=50), st.integers(0, 5000))
def test_keep_recent_tokens_keeps_at_most_the_budget_and_nothing_more_could_fit(tokens, budget):
    n_drop = keep_recent_tokens(tokens, budget)
    assert sum(tokens[n_drop:]) <= budget
    if n_drop > 0:
        assert sum(tokens[n_drop - 1:]) > budget


@given(st.lists(st.integers(1, 500), max_size=50), st.floats(0.01, 1.0))
def test_oldest_fraction_never_drops_more_chunks_than_exist(tokens, fraction):
    assert 0 <= drop_oldest_fraction(tokens, fraction) <= len(tokens)


def test_policies_are_built_by_name_and_validated_at_once():
    assert make_policy("oldest_fraction", fraction=0.25)([1] * 8) == 2
    with pytest.raises(ConfigError, match="unknown eviction policy"):
        make_policy("random")
    with pytest.raises(ConfigError, match="fraction"):
        make_policy("oldest_fraction", fraction=1.5)
