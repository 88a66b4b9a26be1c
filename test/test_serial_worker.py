"""SerialWorker: calls in order on one thread, a cancelled one skipped, a stop that cancels."""

import threading

import pytest

from csr_ros.serial_worker import SerialWorker


def test_serial_worker_runs_calls_in_order_and_delivers_their_errors():
    worker = SerialWorker("csr-test")
    ran = []
    first = worker.submit(lambda: ran.append(1) or "one")
    failing = worker.submit(lambda: 1 / 0)
    assert first.result(5) == "one"
    with pytest.raises(ZeroDivisionError):
        failing.result(5)
    assert worker.submit(lambda: ran.append(2)).result(5) is None and ran == [1, 2]
    worker.stop(timeout_s=5.0)
    assert worker.idle and worker.backlog == 0


def test_serial_worker_stop_cancels_what_has_not_started():
    worker = SerialWorker("csr-test")
    started, release = threading.Event(), threading.Event()
    running = worker.submit(lambda: started.set() or release.wait())
    assert started.wait(5)
    queued = worker.submit(lambda: "never")
    assert worker.backlog == 2
    worker.stop(cancel_queued=True)
    assert queued.cancelled()
    release.set()
    assert running.result(5) is True
    worker._thread.join(5)
    assert worker.idle
