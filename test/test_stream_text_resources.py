"""A query's `on_text` follows the answer as it is decoded, on every kind of resource: the local
engine in process, the same engine in a worker process (the text crosses the pipe token by
token), and a llama.cpp server (the text of each streamed piece as it arrives). What `on_text`
raises stops the decode there and leaves the resource answering the next query as before."""

from __future__ import annotations

import pytest

from csr_ros.errors import QueryCancelledError
from csr_ros.layout import Layout
from csr_ros.model_store import resolve_model_dir
from csr_ros.state import CsrState
from csr_ros.tokenizer import HFTokenizer

COUNT = "Count from 1 to 300, one number after the other, separated by commas."


@pytest.fixture(scope="module")
def tokenizer():
    return HFTokenizer(resolve_model_dir(weights=False))


def request_of(tokenizer, *, mode: str = "token"):
    state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                     profile="You are a helpful assistant.", mode=mode)
    state.add("[t=0.0s] speech (Ana): let us count together", source="speech", stamp_ns=0)
    return state, state.build_request(task=COUNT)


def stop_after(n_calls: int, texts: list[str]):
    def on_text(text: str) -> None:
        texts.append(text)
        if len(texts) >= n_calls:
            raise QueryCancelledError(f"stopped after {len(texts)} texts")
    return on_text


def assert_grows_into(texts: list[str], answer: str) -> None:
    """Each text so far is a prefix of the next and of the answer, the last is the answer."""
    assert len(texts) > 1, texts
    for before, after in zip(texts, texts[1:]):
        assert after.startswith(before.rstrip("\ufffd")), (before, after)
    assert texts[-1] == answer


def test_the_local_engine_hands_on_the_text_after_every_token(smollm2):
    from csr_ros.resources.local import LocalResource

    resource = LocalResource.from_engine(smollm2, name="r1")
    state, request = request_of(smollm2.tokenizer)
    resource.load(request.static_ids)
    texts: list[str] = []
    tokens: list[int] = []
    answer = resource.query(request, max_new_tokens=12, on_token=tokens.append,
                            on_text=texts.append)
    assert tokens == list(range(1, 13)) and len(texts) == 12
    assert_grows_into(texts, answer.text)
    with pytest.raises(QueryCancelledError, match="after 3 texts"):
        resource.query(request, max_new_tokens=200, on_text=stop_after(3, []))
    assert resource.n_committed == len(request.static_ids)
    assert resource.query(request, max_new_tokens=12).token_ids == answer.token_ids


def test_the_llamacpp_engine_in_process_hands_on_the_text_after_every_token(tokenizer):
    pytest.importorskip("llama_cpp")
    from csr_ros.resources.local import LocalResource

    resource = LocalResource("smollm2", name="r1", backend="llamacpp", threads=1,
                             max_context_tokens=1024)
    try:
        state, request = request_of(resource.engine.tokenizer)
        resource.load(request.static_ids)
        texts: list[str] = []
        answer = resource.query(request, max_new_tokens=12, on_text=texts.append)
        assert len(texts) == answer.n_generated == 12
        assert_grows_into(texts, answer.text)
        with pytest.raises(QueryCancelledError, match="after 3 texts"):
            resource.query(request, max_new_tokens=200, on_text=stop_after(3, []))
        assert resource.query(request, max_new_tokens=12).token_ids == answer.token_ids
    finally:
        resource.close()


@pytest.mark.slow
def test_a_worker_process_streams_the_text_across_its_pipe_and_obeys_a_stop(tokenizer):
    from csr_ros.resources.process import ProcessResource

    resource = ProcessResource("local", name="w1", threads=1, max_context_tokens=1024)
    try:
        state, request = request_of(tokenizer)
        resource.load(request.static_ids)
        texts: list[str] = []
        seen: list[int] = []
        answer = resource.query(request, max_new_tokens=10, on_text=texts.append,
                                on_token=seen.append)
        assert len(texts) == answer.n_generated == 10 and seen == [10]
        assert_grows_into(texts, answer.text)
        stopped: list[str] = []
        with pytest.raises(QueryCancelledError, match="after 2 texts"):
            resource.query(request, max_new_tokens=200, on_text=stop_after(2, stopped))
        assert len(stopped) == 2, "nothing reaches on_text once it raised"
        # the child stopped between two tokens and rolled back: the pipe is in step and the
        # committed run is the static part, so the next query answers as the first did
        assert resource.alive and resource.n_committed == len(request.static_ids)
        again = resource.query(request, max_new_tokens=10)
        assert again.token_ids == answer.token_ids
    finally:
        resource.close()


@pytest.mark.server
def test_an_http_resource_hands_on_each_streamed_piece_as_it_arrives(llama_server, tokenizer):
    from csr_ros.resources.factory import make_resource

    resource = make_resource("openai", url=llama_server.url, tokenizer=tokenizer)
    try:
        state, request = request_of(tokenizer, mode="text")
        texts: list[str] = []
        answer = resource.query(request, max_new_tokens=10, on_text=texts.append)
        assert_grows_into(texts, answer.text)
        stopped: list[str] = []
        with pytest.raises(QueryCancelledError, match="after 2 texts"):
            resource.query(request, max_new_tokens=200, on_text=stop_after(2, stopped))
        assert len(stopped) == 2
        assert resource.query(request, max_new_tokens=10).text == answer.text
    finally:
        resource.close()
