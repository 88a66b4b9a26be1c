"""`wait_until`: the one deadline poll, on a fake clock."""

import threading

import pytest

from csr_ros.errors import ResourceTimeoutError
from csr_ros.waiting import wait_until


class FakeClock:
    def __init__(self):
        self.now_s = 0.0
        self.slept_s: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, s: float) -> None:
        self.slept_s.append(s)
        self.now_s += s


def test_wait_until_returns_the_conditions_first_truthy_value():
    clock = FakeClock()
    answers = iter([None, 0, "ready"])
    assert wait_until(lambda: next(answers), 10.0, interval_s=1.0, sleep=clock.sleep,
                      clock=clock) == "ready"
    assert clock.slept_s == [1.0, 1.0]


def test_wait_until_asks_once_more_at_the_deadline_then_returns_none():
    clock = FakeClock()
    asked = []
    assert wait_until(lambda: asked.append(clock()), 2.5, interval_s=1.0, sleep=clock.sleep,
                      clock=clock) is None
    assert asked == [0.0, 1.0, 2.0, 2.5]


def test_wait_until_raises_the_given_error_when_the_time_is_up():
    clock = FakeClock()
    with pytest.raises(ResourceTimeoutError, match="not ready"):
        wait_until(lambda: False, 1.0, sleep=clock.sleep, clock=clock,
                   timeout_error=ResourceTimeoutError("not ready"))


def test_wait_until_ends_when_stop_is_set():
    stop = threading.Event()
    stop.set()
    assert wait_until(lambda: False, 60.0, stop=stop) is None


def test_wait_until_without_a_timeout_waits_until_the_condition_holds():
    clock = FakeClock()
    answers = iter([False] * 50 + [True])
    assert wait_until(lambda: next(answers), None, interval_s=5.0, sleep=clock.sleep,
                      clock=clock) is True
    assert clock.now_s == 250.0
