"""The policy's fold of csr/chunks and csr/swaps: gap-free, late joiners catch up, swaps evict,
a new chunk stream (an aggregator restarted without its chunk log) starts a new version, and a
restarted reconciler's start event is adopted."""

from __future__ import annotations

import pytest

from csr_ros.chunklog import ChunkRecord, VersionRecord, rebuild_state
from csr_ros.chunks import ChunkPolicy
from csr_ros.errors import ConfigError
from csr_ros.node_logic.health import state_view
from csr_ros.node_logic.stream import (ChunkEvent, FetchRequest, Lost, SeqOrderer, StateFold,
                                       SwapEvent)
from csr_ros.state import CsrState

PROFILE = "You are the policy of a test robot."


def new_state(tokenizer, layout, **kw):
    return CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE,
                    policy=ChunkPolicy(oversize="truncate", max_chunk_tokens=64), **kw)


def event(seq: int, stream: str = "", text: str | None = None) -> ChunkEvent:
    return ChunkEvent(seq=seq, source="odom", stamp_ns=1_000 + seq,
                      text=text or f"odom: x_m={seq * 0.5} y_m=1", stream=stream)


@pytest.fixture
def fold(tokenizer, layout):
    return StateFold(new_state(tokenizer, layout))


def test_chunks_in_order_are_appended_with_their_seq(fold):
    for seq in range(3):
        assert fold.on_chunk(event(seq)) is None
    assert [c.seq for c in fold.state.chunks] == [0, 1, 2]
    assert fold.state.chunks[1].text == "odom: x_m=0.5 y_m=1\n"


def test_a_duplicate_is_ignored_and_counted(fold):
    fold.on_chunk(event(0))
    fold.on_chunk(event(0))
    assert len(fold.state.chunks) == 1 and fold.order.counters.duplicates == 1


def test_a_gap_asks_for_the_missing_range_once_and_holds_later_chunks(fold):
    fold.on_chunk(event(0))
    assert fold.on_chunk(event(3)) == FetchRequest(start_seq=1, end_seq=3)
    assert fold.on_chunk(event(4)) is None          # a fetch is already running
    assert fold.next_seq == 1 and fold.n_held == 2
    assert fold.on_fetched([event(2), event(1)], first_available_seq=0) is None
    assert [c.seq for c in fold.state.chunks] == [0, 1, 2, 3, 4]
    assert fold.n_held == 0 and fold.lost == 0


def test_the_policy_diagnostics_count_what_the_orderer_did(fold):
    fold.on_chunk(event(0))
    fold.on_chunk(event(0))
    fold.on_chunk(event(3))                          # 1 and 2 missing: fetched
    assert fold.on_fetch_failed() == FetchRequest(1, 3)
    fold.on_fetched([event(1), event(2)], first_available_seq=0)
    view = state_view(fold)
    assert (view["chunks_delivered"], view["duplicate_chunks"], view["out_of_order_chunks"]) \
        == (4, 1, 1)
    assert (view["fetches"], view["fetch_failures"], view["lost_chunks"]) == (2, 1, 0)


def test_a_late_joiner_fetches_everything_before_its_first_live_chunk(fold):
    assert fold.on_chunk(event(5)) == FetchRequest(start_seq=0, end_seq=5)
    fold.on_fetched([event(s) for s in range(5)], first_available_seq=0)
    assert [c.seq for c in fold.state.chunks] == [0, 1, 2, 3, 4, 5]


def test_chunks_the_aggregator_no_longer_has_are_skipped_and_counted(fold):
    fold.on_chunk(event(10))
    assert fold.on_fetched([event(7), event(8), event(9)], first_available_seq=7) is None
    assert [c.seq for c in fold.state.chunks] == [7, 8, 9, 10]
    assert fold.lost == 7


def test_a_partial_answer_asks_for_the_rest(fold):
    fold.on_chunk(event(6))
    request = fold.on_fetched([event(0), event(1)], first_available_seq=0)  # max_chunks cut it
    assert request == FetchRequest(start_seq=2, end_seq=6)


def test_a_gap_nobody_can_fill_is_given_up_after_retries(fold):
    fold.on_chunk(event(2))
    assert fold.on_fetch_failed() == FetchRequest(0, 2)
    assert fold.on_fetch_failed() == FetchRequest(0, 2)
    assert fold.on_fetch_failed() is None
    assert [c.seq for c in fold.state.chunks] == [2] and fold.lost == 2


def test_a_swap_evicts_old_chunks_and_sets_version_and_primary(fold):
    for seq in range(6):
        fold.on_chunk(event(seq))
    assert fold.on_swap(SwapEvent(version=1, primary="r2", primary_url="http://b:8002",
                                  evicted_before_seq=3, caught_up_to_seq=5))
    assert [c.seq for c in fold.state.chunks] == [3, 4, 5]
    assert (fold.version, fold.primary, fold.primary_url) == (1, "r2", "http://b:8002")
    fold.on_chunk(event(6))
    assert fold.next_seq == 7


def test_a_stale_or_repeated_swap_changes_nothing(fold):
    fold.on_swap(SwapEvent(version=2, primary="r1", evicted_before_seq=0))
    assert not fold.on_swap(SwapEvent(version=1, primary="r2", evicted_before_seq=0))
    assert fold.version == 2 and fold.primary == "r1" and fold.counters.stale_swaps == 1


def test_the_initial_swap_event_names_the_primary_without_a_new_version(fold):
    assert not fold.on_swap(SwapEvent(version=0, primary="r1", primary_url="http://a:8001"))
    assert fold.primary_url == "http://a:8001"


def test_a_restarted_node_learns_the_version_first_and_fetches_only_live_chunks(fold):
    fold.on_swap(SwapEvent(version=3, primary="r2", evicted_before_seq=40))
    assert fold.next_seq == 40
    assert fold.on_chunk(event(43)) == FetchRequest(start_seq=40, end_seq=43)
    fold.on_fetched([event(40), event(41), event(42)], first_available_seq=0)
    assert [c.seq for c in fold.state.chunks] == [40, 41, 42, 43]


def test_the_fold_gives_the_same_tokens_as_the_chunk_log_rebuild(fold, tokenizer, layout):
    for seq in range(8):
        fold.on_chunk(event(seq))
    fold.on_swap(SwapEvent(version=1, primary="r2", evicted_before_seq=4))
    fold.on_chunk(event(8))
    records = [ChunkRecord(seq=seq, source="odom", stamp_ns=1_000 + seq, text=event(seq).text + "\n")
               for seq in range(8)]
    records.append(VersionRecord(version=1, first_seq=4, next_seq=8, reason="swap"))
    records.append(ChunkRecord(seq=8, source="odom", stamp_ns=1_008, text=event(8).text + "\n"))
    rebuilt = rebuild_state(records, new_state(tokenizer, layout))
    assert fold.state.static_ids == rebuilt.static_ids
    assert fold.version == rebuilt.version


def test_text_the_chunk_policy_refuses_becomes_a_placeholder_keeping_seq(tokenizer, layout):
    state = CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE,
                     policy=ChunkPolicy(oversize="truncate", invalid_utf8="reject"))
    fold = StateFold(state)
    fold.on_chunk(event(0, text="   "))
    assert fold.state.chunks[0].text == "odom: [chunk 0 refused]\n"
    assert fold.counters.rejected == 1 and fold.next_seq == 1


def test_a_splitting_chunk_policy_is_refused(tokenizer, layout):
    state = CsrState(tokenizer=tokenizer, layout=layout, profile=PROFILE)
    with pytest.raises(ConfigError, match="must not split chunks"):
        StateFold(state)


def test_the_orderer_reports_lost_ranges_in_order_with_the_events_around_them():
    order = SeqOrderer(0)
    assert order.offer(event(0)).items == (event(0),)
    step = order.offer(event(4))
    assert step.items == () and step.fetch == FetchRequest(1, 4)
    step = order.fetched([event(3)], first_available_seq=3)
    assert step.items == (Lost(1, 3), event(3), event(4)) and step.fetch is None
    assert order.next_seq == 5 and order.counters.lost == 2


def test_the_orderer_drops_held_events_that_were_evicted():
    order = SeqOrderer(0)
    order.offer(event(2))
    order.offer(event(9))
    step = order.advance_to(5)
    assert step.items == () and step.fetch is None   # the first fetch (0..2) is still running
    assert order.n_held == 1 and order.next_seq == 5


def test_a_start_probe_fetches_the_history_of_a_quiet_stream(fold):
    assert fold.probe() == FetchRequest(start_seq=0, end_seq=0)
    assert fold.on_fetched([event(5), event(6)], first_available_seq=5, probe=True) is None
    assert [c.seq for c in fold.state.chunks] == [5, 6] and fold.lost == 5


def test_a_restarted_reconciler_resets_the_version_with_its_start_event(fold):
    fold.on_swap(SwapEvent(version=4, primary="r2", evicted_before_seq=0))
    assert fold.on_swap(SwapEvent(version=0, primary="r1", evicted_before_seq=0, reason="start"))
    assert fold.version == 0 and fold.primary == "r1"


# -- a new chunk stream: an aggregator restarted without its chunk log ---------------------------

def test_a_new_stream_starts_a_new_version_instead_of_merging(fold):
    for seq in range(5):
        fold.on_chunk(event(seq, "a"))
    assert fold.on_chunk(event(0, "b", "speech: data=hello")) is None
    assert fold.version == 1 and fold.stream == "b"
    assert [c.text for c in fold.state.chunks] == ["speech: data=hello\n"]
    assert fold.counters.stream_restarts == 1 and fold.order.counters.duplicates == 0
    restart = fold.last_restart
    assert (restart.old_stream, restart.new_stream, restart.dropped_chunks) == ("a", "b", 5)
    assert "restarted without its chunk log" in restart.describe()


def test_late_chunks_of_a_retired_stream_are_dropped_and_counted(fold):
    fold.on_chunk(event(0, "a"))
    fold.on_chunk(event(0, "b"))
    fold.on_chunk(event(1, "a"))
    assert [c.seq for c in fold.state.chunks] == [0] and fold.counters.retired_chunks == 1


def test_a_swap_naming_a_new_stream_resets_before_its_first_chunk_arrives(fold):
    for seq in range(3):
        fold.on_chunk(event(seq, "a"))
    assert fold.on_swap(SwapEvent(version=4, primary="r2", reason="stream", stream="b"))
    assert fold.version == 4 and fold.state.chunks == [] and fold.next_seq == 0
    fold.on_chunk(event(0, "b"))
    assert [c.seq for c in fold.state.chunks] == [0]


def test_a_get_chunks_answer_from_a_new_stream_is_a_new_stream(fold):
    for seq in range(3):
        fold.on_chunk(event(seq, "a"))
    fold.on_fetched([event(0, "b"), event(1, "b")], 0, stream="b", probe=True)
    assert fold.stream == "b" and [c.seq for c in fold.state.chunks] == [0, 1]


# -- a restarted reconciler ---------------------------------------------------------------------

def test_a_start_event_with_the_version_the_policy_holds_is_adopted(fold):
    for seq in range(6):
        fold.on_chunk(event(seq))
    fold.on_swap(SwapEvent(version=2, primary="r2", evicted_before_seq=0, reason="start"))
    assert fold.on_swap(SwapEvent(version=2, primary="r1", evicted_before_seq=3,
                                  reason="start"))
    assert fold.primary == "r1" and [c.seq for c in fold.state.chunks] == [3, 4, 5]
    assert fold.counters.starts == 2


def test_a_start_event_that_keeps_chunks_the_policy_evicted_refetches_them(fold):
    for seq in range(6):
        fold.on_chunk(event(seq))
    fold.on_swap(SwapEvent(version=3, primary="r2", evicted_before_seq=4, reason="swap"))
    assert fold.on_swap(SwapEvent(version=3, primary="r1", evicted_before_seq=2,
                                  reason="start"))
    assert fold.needs_probe and fold.state.chunks == [] and fold.next_seq == 2
    request = fold.probe()
    assert (request.start_seq, request.end_seq) == (2, 0)
    fold.on_fetched([event(s) for s in range(2, 6)], 0, probe=True)
    assert [c.seq for c in fold.state.chunks] == [2, 3, 4, 5] and fold.version == 3
