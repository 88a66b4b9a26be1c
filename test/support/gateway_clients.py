"""What the gateway tests do as clients, in one place: follow a stream while asking the gateway
how far its decode is, and leave a stream after its first piece.

    pieces, during, last = follow_stream(stream, lambda: sessions()["live"])
    leave_after_first_piece(url, body, headers)
    after = wait_until_idle(lambda: sessions()["gone"])
"""

from __future__ import annotations

from typing import Callable

import httpx

from support.waiting import wait_for


def follow_stream(stream, during: Callable[[], dict]) -> tuple[list[str], dict, object]:
    """The content pieces of an openai client's stream; `during()` taken once, right after
    the first piece arrived; the stream's last event."""
    pieces: list[str] = []
    seen = None
    event = None
    for event in stream:
        if event.choices and event.choices[0].delta.content:
            pieces.append(event.choices[0].delta.content)
            if seen is None:
                seen = during()
    return pieces, seen, event


def leave_after_first_piece(url: str, body: dict, headers: dict) -> None:
    """POST a streamed chat and close the connection once a content piece has come."""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True},
                      headers=headers, timeout=600.0) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                return


def wait_until_idle(session: Callable[[], dict], timeout_s: float = 120.0) -> dict:
    """The session's stats once it has no request in flight."""
    def idle():
        stats = session()
        return None if stats["in_flight"] else stats
    return wait_for(idle, timeout_s, what="the session to have no request in flight")
