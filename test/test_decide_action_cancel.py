"""Cancelling a query between two tokens (what a cancelled Decide goal does): the `on_token`
callback of a resource's query follows the answer token by token, and what it raises stops the
decode there. The local engine rolls its state back to the committed boundary, so the next
query answers exactly as if the cancelled one had never run; over HTTP the stream is closed (the
server logs the client leaving) and the same server answers the next query."""

from __future__ import annotations

import pytest

from support.waiting import wait_for

from csr_ros.errors import QueryCancelledError
from csr_ros.layout import Layout
from csr_ros.resources.base import QueryResult
from csr_ros.state import CsrState


COUNT = "Count from 1 to 300, one number after the other, separated by commas."


def cancel_after(n_stop: int, seen: list[int]):
    def on_token(n_tokens: int) -> None:
        seen.append(n_tokens)
        if n_tokens >= n_stop:
            raise QueryCancelledError(f"cancelled after {n_tokens} tokens")
    return on_token


def request_of(tokenizer, *, mode: str = "token"):
    state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                     profile="You are a helpful assistant.", mode=mode)
    state.add("[t=0.0s] speech (Ana): let us count together", source="speech", stamp_ns=0)
    return state.build_request(task=COUNT)


def test_a_local_decode_stops_between_tokens_and_leaves_the_state_as_it_was(smollm2):
    from csr_ros.resources.local import LocalResource

    resource = LocalResource.from_engine(smollm2, name="r1")
    request = request_of(smollm2.tokenizer)
    resource.load(request.static_ids)
    reference = resource.query(request, max_new_tokens=6)
    assert reference.n_generated == 6               # the count goes on past the budget

    seen: list[int] = []
    with pytest.raises(QueryCancelledError, match="after 3 tokens"):
        resource.query(request, max_new_tokens=200, on_token=cancel_after(3, seen))
    assert seen == [1, 2, 3]                        # stopped at once, not at the budget
    assert resource.n_committed == len(request.static_ids)

    again = resource.query(request, max_new_tokens=6)
    assert again.token_ids == reference.token_ids   # as if the cancelled query never ran


def test_the_progress_callback_sees_every_token_of_an_answer_it_does_not_stop(smollm2):
    from csr_ros.resources.local import LocalResource

    resource = LocalResource.from_engine(smollm2, name="r1")
    request = request_of(smollm2.tokenizer)
    seen: list[int] = []
    result: QueryResult = resource.query(request, max_new_tokens=4, on_token=seen.append)
    assert seen == list(range(1, result.n_generated + 1)) and result.n_generated == 4


def test_an_http_stream_is_closed_between_tokens_and_the_server_answers_the_next_query(
        llama_server, tokenizer):
    from csr_ros.resources.factory import make_resource

    def disconnects() -> int:       # llama-cpp-python's server logs each client that left
        return llama_server.log_path.read_text(errors="replace").count(
            "Disconnected from client")

    resource = make_resource("openai", url=llama_server.url, tokenizer=tokenizer)
    try:
        request = request_of(tokenizer, mode="text")
        reference = resource.query(request, max_new_tokens=8)
        before = disconnects()
        seen: list[int] = []
        with pytest.raises(QueryCancelledError, match="after 2 tokens"):
            resource.query(request, max_new_tokens=200, on_token=cancel_after(2, seen))
        assert seen == [1, 2]
        wait_for(lambda: disconnects() > before, timeout_s=30.0,
                 what="the server to see the stream closed")
        again = resource.query(request, max_new_tokens=8)
        assert again.text == reference.text and again.finish_reason == "length"
    finally:
        resource.close()
