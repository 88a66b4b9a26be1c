"""Two clients of one llama.cpp server (a policy and a reconciler, two policy threads): every
answer completes. llama-cpp-python's server, by default, ends a running stream with a bare
[DONE] (no finish_reason) as soon as another request arrives (its `interrupt_requests`); the
project's launcher turns that off, and the client reports a stream without a finish_reason as
the server's error, never as a budget that ran out."""

from __future__ import annotations

import threading

import pytest

from csr_ros.actions import Vocabulary
from csr_ros.layout import Layout
from csr_ros.resources.openai import OpenAIOptions, OpenAIResource
from csr_ros.state import CsrState

pytestmark = pytest.mark.server

SPECS = ["wait()", "look_around()", "go_to(room: kitchen|living_room|hallway|office)",
         "say(text: str)"]


def test_two_concurrent_clients_of_one_llamacpp_server_both_get_complete_decisions(
        llama_server):  # noqa: F811
    vocab = Vocabulary.parse(SPECS)
    results: dict[int, list] = {0: [], 1: []}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def client(k: int) -> None:
        try:
            with OpenAIResource(OpenAIOptions(llama_server.url)) as resource:
                tok = resource.tokenizer
                state = CsrState(tok, Layout.from_tokenizer(tok),
                                 f"You are robot {k}.\n" + vocab.describe(),
                                 mode=resource.state_mode)
                for i in range(12):
                    state.add(f"[odom {k}] t={i} x={i * 0.1:.2f}", source="odom", stamp_ns=i)
                start.wait(timeout=60)
                for step in range(3):
                    request = state.build_request(task=f"Step {step}: what next?")
                    result = resource.query(request, max_new_tokens=24,
                                            constraint=vocab.constraint())
                    results[k].append((result, vocab.decide(
                        result.text, constrained=result.constrained,
                        finish_reason=result.finish_reason, max_new_tokens=24)))
        except BaseException as exc:                        # noqa: BLE001 (asserted below)
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    for k in (0, 1):
        assert len(results[k]) == 3
        for result, decision in results[k]:
            assert result.finish_reason in ("stop", "length")
            assert decision.action is not None, (result.text, decision.error)
