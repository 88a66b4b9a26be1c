"""The worker-process resource proxy on a real local engine: calls, errors, death, timeouts."""

from __future__ import annotations

import pytest

from csr_ros.errors import (ResourceTimeoutError, ResourceUnavailableError, StateMismatchError)
from csr_ros.layout import Layout
from csr_ros.model_store import resolve_model_dir
from csr_ros.resources.base import Resource
from csr_ros.state import CsrState
from csr_ros.tokenizer import HFTokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def state():
    tokenizer = HFTokenizer(resolve_model_dir(weights=False))
    state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                     profile="You are a robot.")
    for i in range(12):
        state.add(f"t={i}s camera sees mug_{i} at ({i}.25, 0.50)", source="cam", stamp_ns=i)
    return state


@pytest.fixture(scope="module")
def resource():
    from csr_ros.resources.process import ProcessResource

    resource = ProcessResource("local", name="w1", threads=1, max_context_tokens=1024)
    yield resource
    resource.close()


def committed_length(resource) -> int:
    return resource.apply(_n_committed_here)


def _n_committed_here(resource) -> int:
    return len(resource.committed_ids)


def test_a_process_resource_implements_the_resource_interface(resource, state):
    assert isinstance(resource, Resource)
    assert resource.max_context_tokens == 1024
    result = resource.load(state.static_ids)
    assert result.n_committed == state.n_static == resource.n_committed
    assert resource.committed_ids == tuple(state.static_ids)
    answer = resource.query(state.build_request(task="Next action?"), max_new_tokens=2)
    assert answer.resource == "w1" and answer.ttft_s > 0 and answer.n_extended == 0
    assert committed_length(resource) == state.n_static, "apply runs next to the resource"
    # how the worker's engine was chosen arrives with its start, as the worker's own says it
    assert resource.engine_choice == resource.call("engine_choice")
    assert resource.engine_choice["backend"] in ("torch", "llamacpp")


# What each capability flag promises the resource has (csr_ros/resources/base.py).
PROMISES = {"score_choices": ("score_choices",), "capsules": ("engine",),
            "echo_logprobs": ("info", "check_health", "prompt_of", "choice_logprobs",
                              "echo_logprobs"),
            "routing_key": ("routing_key", "routing_key_for", "last_routing_key"),
            "set_threads": ("set_threads",), "background": ("set_background",),
            "timeout": (), "worker": ("apply", "call")}


def _declared_here(resource) -> tuple[set[str], list[str]]:
    """The flags `resource` declares, and each promised attribute it lacks."""
    flags = {flag for flag in PROMISES if getattr(resource.capabilities, flag)}
    return flags, [f"{flag}: {name}" for flag in sorted(flags) for name in PROMISES[flag]
                   if not hasattr(resource, name)]


def test_every_capability_a_resource_declares_comes_with_what_it_promises(resource, state):
    assert _declared_here(resource) == ({"background", "timeout", "worker"}, [])
    # The local resource in the worker declares its own, which stay there.
    assert resource.apply(_declared_here) == ({"score_choices", "capsules", "set_threads"}, [])
    resource.load(state.static_ids)
    seen: list[int] = []
    answer = resource.query(state.build_request(task="Next action?"), max_new_tokens=3,
                            on_token=seen.append)
    assert seen == [answer.n_generated], "on_token once, when the answer is back"


def test_an_error_in_the_worker_arrives_as_the_same_exception(resource, state):
    resource.load(state.static_ids[:10])
    other = CsrState(tokenizer=state.tokenizer, layout=state.layout, profile="Another robot.")
    with pytest.raises(StateMismatchError, match="do not start with the committed run"):
        resource.query(other.build_request(task="Next?"), max_new_tokens=2)
    assert resource.alive, "a refused call leaves the worker running"


def test_a_dead_worker_raises_unavailable_and_load_starts_a_new_one(resource, state):
    resource.load(state.static_ids)
    old_pid = resource.pid
    resource.kill()
    with pytest.raises(ResourceUnavailableError, match="not running"):
        resource.extend(state.static_ids[:4])
    with pytest.raises(ResourceUnavailableError):
        resource.query(state.build_request(task="Next?"), max_new_tokens=2)
    result = resource.load(state.static_ids)
    assert resource.pid != old_pid and resource.restarts >= 1
    assert result.n_committed == state.n_static
    assert resource.committed_ids == tuple(state.static_ids)


def test_a_call_over_its_timeout_kills_the_worker_and_raises_timeout(resource, state):
    with pytest.raises(ResourceTimeoutError, match="did not answer within"):
        resource.load(state.static_ids * 3, timeout_s=0.01)
    assert not resource.alive
    resource.load(state.static_ids)                     # the retry recovers by itself
    assert resource.n_committed == state.n_static


def test_background_priority_can_be_set_and_restored(resource):
    import os

    resource.set_background(True)
    assert os.getpriority(os.PRIO_PROCESS, resource.pid) == resource.background_nice
    resource.set_background(False)
    if os.geteuid() == 0:                               # raising priority needs the right to
        assert os.getpriority(os.PRIO_PROCESS, resource.pid) == 0


def _torch_threads_here(resource) -> int:
    import torch

    return torch.get_num_threads()


def test_background_work_runs_on_its_own_threads_and_queries_on_all_of_them(state):
    from csr_ros.resources.process import ProcessResource

    resource = ProcessResource("local", name="w2", threads=2, background_threads=1,
                               max_context_tokens=1024)
    try:
        assert resource.apply(_torch_threads_here) == 2
        resource.set_background(True)                   # a warm-up or catch-up
        assert resource.apply(_torch_threads_here) == 1
        assert resource.load(state.static_ids).n_committed == state.n_static
        resource.set_background(False)                  # queries again
        assert resource.apply(_torch_threads_here) == 2
        answer = resource.query(state.build_request(task="Next action?"), max_new_tokens=2)
        assert answer.resource == "w2"
    finally:
        resource.close()


def test_a_worker_started_again_during_background_work_stays_in_the_background(state):
    import os

    from csr_ros.resources.process import ProcessResource

    resource = ProcessResource("local", name="w3", threads=2, background_threads=1,
                               max_context_tokens=1024)
    try:
        resource.set_background(True)                   # a warm-up begins...
        old_pid = resource.pid
        resource.kill()                                 # ...and its worker dies
        resource.set_background(True)                   # the retry asks again, to a dead child
        assert resource.load(state.static_ids).n_committed == state.n_static
        assert resource.pid != old_pid
        assert os.getpriority(os.PRIO_PROCESS, resource.pid) == resource.background_nice
        assert resource.apply(_torch_threads_here) == 1, "not every core for a secondary"
        resource.set_background(False)
        assert resource.apply(_torch_threads_here) == 2
    finally:
        resource.close()


def test_resources_started_in_turn_start_the_first_alone_and_the_others_on_their_first_load(
        state):
    import os

    from csr_ros.resources.process import start_in_turn

    first, second = start_in_turn(["w5", "w6"], "local", threads=2, background_threads=1,
                                  max_context_tokens=1024)
    try:
        assert first.alive and not second.alive and second.pid is None
        assert second.max_context_tokens == first.max_context_tokens == 1024
        assert second.state_mode == first.state_mode
        with pytest.raises(ResourceUnavailableError, match="has not started yet"):
            second.extend(state.static_ids[:4])
        # its first load starts it, in the background of the running first, and is no restart
        assert second.load(state.static_ids).n_committed == state.n_static
        assert second.alive and second.pid != first.pid and second.restarts == 0
        assert os.getpriority(os.PRIO_PROCESS, second.pid) == second.background_nice
        assert second.apply(_torch_threads_here) == 1
        assert second.committed_ids == tuple(state.static_ids)
        second.kill()                                   # a death after that is a restart
        assert second.revive() and second.restarts == 1
    finally:
        first.close()
        second.close()


def test_a_primary_started_without_waiting_serves_its_first_call_and_tells_its_sibling_its_facts(
        state):
    from csr_ros.resources.process import start_in_turn

    first, second = start_in_turn(["w7", "w8"], "local", wait=False, threads=1,
                                  max_context_tokens=1024)
    try:
        assert first.alive and first.pid is not None    # launched, its start not waited for
        # the sibling's facts are the first's, from the first's start once it reports
        assert second.max_context_tokens == 1024 and second.state_mode == "token"
        assert first.engine_choice is not None
        assert first.load(state.static_ids).n_committed == state.n_static
        first.wait_started()                            # once started, at once
        assert not second.alive and first.restarts == 0
    finally:
        first.close()
        second.close()


def test_a_start_that_fails_without_being_waited_for_raises_at_the_first_call():
    from csr_ros.errors import ModelNotFoundError
    from csr_ros.resources.process import ProcessResource

    resource = ProcessResource("local", name="w9", wait=False, model="/nonexistent/model")
    try:
        with pytest.raises(ModelNotFoundError):
            resource.wait_started()
        assert not resource.alive
        with pytest.raises(ResourceUnavailableError):
            resource.extend([1, 2])
    finally:
        resource.close()


def test_a_worker_closed_during_its_start_is_gone_when_close_returns():
    from csr_ros.resources.process import ProcessResource
    from csr_ros.soak.probes import alive

    resource = ProcessResource("local", name="w10", wait=False, threads=1,
                               max_context_tokens=1024)
    pid = resource.pid
    resource.close()
    assert not alive(pid)


def test_a_busy_worker_is_set_to_background_after_its_call_without_the_caller_waiting(state):
    """A caller that holds its own lock (the reconciler's) must not wait for a stopped
    worker's call to end: the threads are set once the call is over."""
    import os
    import signal
    import threading

    from csr_ros.resources.process import ProcessResource
    from support.waiting import wait_for

    resource = ProcessResource("local", name="w4", threads=2, background_threads=1,
                               max_context_tokens=1024)
    try:
        os.kill(resource.pid, signal.SIGSTOP)           # a stall: its call cannot end
        call = threading.Thread(target=resource.load, args=(state.static_ids,), daemon=True)
        call.start()
        wait_for(lambda: resource._lock.locked(), what="the load to hold the worker")
        asked = threading.Thread(target=resource.set_background, args=(True,), daemon=True)
        asked.start()
        asked.join(60)        # the stopped call never ends: waiting for it would never return
        assert not asked.is_alive(), "set_background waited for the stopped worker's call"
        assert call.is_alive(), "the stopped call ended before SIGCONT"
        os.kill(resource.pid, signal.SIGCONT)
        call.join(120)
        assert not call.is_alive() and resource.n_committed == state.n_static
        assert resource.apply(_torch_threads_here) == 1, "set right after the call"
        assert os.getpriority(os.PRIO_PROCESS, resource.pid) == resource.background_nice
    finally:
        resource.close()


def test_a_worker_whose_parent_died_during_a_call_ends_quietly_and_a_result_that_cannot_be_sent_arrives_as_an_error():
    import multiprocessing
    import threading

    from csr_ros.resources.process import _reply

    ours, parents = multiprocessing.Pipe()
    parents.close()                     # the parent died while the call ran
    assert _reply(ours, "query", "an answer", None) is False
    ours.close()

    ours, parents = multiprocessing.Pipe()
    assert _reply(ours, "engine.snapshot", threading.Lock(), None) is True
    status, error = parents.recv()
    assert status == "error" and "engine.snapshot cannot be sent" in str(error)
    ours.close(), parents.close()
