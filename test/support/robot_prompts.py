"""A real CSR prompt from rendered robot chunks, for any model's tokenizer (engine tests), and
a model pushed to answer out of the range of bounded actions (every backend's bounds test)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from csr_ros.actions import Decision
from csr_ros.layout import Layout
from csr_ros.state import CsrState


def robot_prompt_ids(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(static_ids, dynamic_ids) of six sensor chunks and an obstacle question."""
    state = CsrState(tokenizer=tokenizer, layout=Layout.from_tokenizer(tokenizer),
                     profile="You are the policy of a mobile robot. Answer with one action.")
    for i in range(6):
        state.add(f"[t={i * 0.5:.1f}s] odom x={0.1 * i:.2f} y={0.05 * i:.2f} yaw={0.3 * i:.2f}; "
                  f"battery {95 - i}%; lidar min {1.5 - 0.1 * i:.2f} m ahead",
                  source="sensors", stamp_ns=i * 500_000_000)
    request = state.build_request(task="An obstacle is ahead. What do you do next?",
                                  suffix="now: t=6.0s")
    return request.static_ids, request.dynamic_ids


# -- bounded actions: a model pushed out of range (test_actions_*, test_engine_llamacpp, vLLM) --

#: The actions with their bounds, and the same without: what a server that knows nothing of the
#: bounds decodes (its answer reaches decide() as free text would).
BOUNDED_ACTIONS = ("wait()", "turn(degrees: int[-180,180])", "drive(speed_mps: float[0,0.5])")
UNBOUNDED_ACTIONS = ("wait()", "turn(degrees: int)", "drive(speed_mps: float)")
#: Operators asking for more than the robot may do: on SmolLM2 (float32, bf16 and the Q4_1
#: GGUF alike) the unbounded grammar decodes turn(720) and drive(3).
PUSHED_TASKS = ("The operator says: turn 720 degrees. Which action next?",
                "The operator says: drive at 3 meters per second. Which action next?")


@dataclass(frozen=True)
class Pushed:
    task: str
    bounded: Decision          # decoded under the bounded constraint
    unbounded: Decision        # decoded under the unbounded grammar, read as free text


def decide_pushed(resource, tokenizer, *, kind: str = "grammar", mode: str | None = None,
                  max_new_tokens: int = 32) -> list[Pushed]:
    """Each pushed task over one request whose profile lists the actions without their bounds
    (the model is not told them), decoded twice: under the bounded vocabulary's `kind`
    constraint and under the unbounded grammar. The bounded vocabulary decides both."""
    from csr_ros.actions import Vocabulary
    from csr_ros.demo_episode import Episode

    bounded, unbounded = Vocabulary.parse(BOUNDED_ACTIONS), Vocabulary.parse(UNBOUNDED_ACTIONS)
    state = CsrState(tokenizer, Layout.from_tokenizer(tokenizer),
                     "You are the decision policy of a mobile robot.\n" + unbounded.describe(),
                     **({"mode": mode} if mode else {}))
    for item in itertools.islice(Episode(0).stream(), 6):
        state.add(item.text, source=item.source)
    resource.load(state.static_ids)            # whatever an earlier test left committed
    out = []
    for task in PUSHED_TASKS:
        request = state.build_request(task=task)
        answers = [resource.query(request, max_new_tokens=max_new_tokens, constraint=c)
                   for c in (bounded.constraint(kind), unbounded.constraint("grammar"))]
        assert all(a.constrained for a in answers), "the backend sent no constraint"
        inside, outside = (bounded.decide(a.text, constrained=c, finish_reason=a.finish_reason,
                                          max_new_tokens=max_new_tokens)
                           for a, c in zip(answers, (True, False)))
        out.append(Pushed(task, inside, outside))
    return out


def assert_bounds_hold(results: list[Pushed]) -> None:
    """Every bounded answer is an action in range; unbounded, the model went out of range at
    least once (or the test would prove nothing), and decide() refused each such answer."""
    from decimal import Decimal

    from csr_ros.actions import Vocabulary

    ranges = {s.name: s.args[0] for s in Vocabulary.parse(BOUNDED_ACTIONS).actions if s.args}
    for r in results:
        assert r.bounded.valid, (r.task, r.bounded.text, r.bounded.error)
        for name, value in r.bounded.action.args:
            arg = ranges[r.bounded.action.name]
            assert arg.low <= Decimal(repr(value)) <= arg.high, (r.task, r.bounded.text)
    refused = [r for r in results if " outside [" in r.unbounded.error]
    assert refused, [(r.task, r.unbounded.text) for r in results]
    for r in refused:
        assert r.unbounded.action is None
        assert r.unbounded.error.startswith(("turn: degrees ", "drive: speed_mps "))
