"""The synthetic episode: deterministic by seed, well-formed chunks, a parseable action menu."""

from __future__ import annotations

import itertools

from csr_ros.demo_episode import Episode


def take(episode: Episode, n: int):
    return list(itertools.islice(episode.stream(), n))


def test_the_same_seed_gives_the_same_stream():
    assert take(Episode(7), 60) == take(Episode(7), 60)


def test_different_seeds_give_different_streams():
    assert take(Episode(1), 20) != take(Episode(2), 20)


def test_chunks_come_at_the_configured_rate_from_every_source():
    items = take(Episode(0, chunk_rate_hz=4.0), 40)
    assert [i.t_s for i in items] == [n / 4.0 for n in range(40)]
    assert {i.source for i in items} == {"camera", "odometry", "speech", "action"}
    assert all(i.text.strip() and f"t={i.t_s:.1f}s" in i.text for i in items)


def test_more_detail_makes_camera_chunks_longer():
    short = [i.text for i in take(Episode(0, detail=1), 40) if i.source == "camera"]
    long = [i.text for i in take(Episode(0, detail=5), 40) if i.source == "camera"]
    assert sum(map(len, long)) > 2 * sum(map(len, short))


def test_the_profile_lists_every_action_with_its_number():
    episode = Episode(0)
    for n, action in enumerate(episode.actions, 1):
        assert f"{n}. {action}" in episode.profile()
