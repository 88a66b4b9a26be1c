"""The per-topic coalescer keeps the newest value and lets it through when the period elapses."""

from __future__ import annotations

import pytest

from csr_ros.errors import ConfigError
from csr_ros.render import Coalescer

MS = 1_000_000


def test_first_value_passes_at_once():
    c = Coalescer({"scan": 0.1})
    e = c.offer("scan", "a", 0)
    assert (e.key, e.value, e.n_coalesced) == ("scan", "a", 0)


def test_values_inside_the_period_are_held_and_the_newest_is_emitted_when_due():
    c = Coalescer({"scan": 0.1})
    c.offer("scan", "a", 0)
    assert c.offer("scan", "b", 20 * MS) is None
    assert c.offer("scan", "c", 50 * MS) is None
    assert c.poll(99 * MS) == []
    [e] = c.poll(100 * MS)
    assert (e.value, e.n_coalesced) == ("c", 1)   # 'b' was superseded and counted
    assert c.n_superseded_total == 1
    assert c.poll(500 * MS) == []                 # nothing held any more


def test_a_late_offer_emits_at_once_and_counts_the_held_value_it_replaces():
    c = Coalescer({"scan": 0.1})
    c.offer("scan", "a", 0)
    c.offer("scan", "b", 10 * MS)
    e = c.offer("scan", "c", 150 * MS)            # poll was not called in time
    assert (e.value, e.n_coalesced) == ("c", 1)
    assert c.n_pending == 0


def test_topics_are_limited_independently_and_unknown_ones_use_the_default_period():
    c = Coalescer({"scan": 1.0}, default_period_s=0.0)
    c.offer("scan", 1, 0)
    assert c.offer("scan", 2, 1) is None
    assert c.offer("speech", "hi", 1).value == "hi"
    assert c.offer("speech", "again", 2).value == "again"
    assert c.next_due_ns() == 1_000_000_000


def test_flush_lets_every_held_value_through():
    c = Coalescer({"a": 1.0, "b": 1.0})
    for key in "ab":
        c.offer(key, 0, 0)
        c.offer(key, 1, 1)
    assert sorted((e.key, e.value) for e in c.flush(2)) == [("a", 1), ("b", 1)]


def test_negative_period_is_a_config_error():
    with pytest.raises(ConfigError, match="min period of 'scan' must be >= 0 s"):
        Coalescer({"scan": -1.0})
