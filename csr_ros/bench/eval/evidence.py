"""Evidence coverage: is what makes a question's answer true inside the prompt a method built?

A question names its evidence as observations (`Evidence`: a time on the episode's clock, and
optionally the source and a text the observation holds). Before a replay each is resolved to
the observations it means (`resolve`), keyed by (source, stamp_ns), the two things every chunk
made from an observation carries. At a question, the evidence is covered when every chunk of
every evidence observation is in the prompt (`covered`). That is a property of the memory,
not of the model: it separates "the memory lost it" from "the model could not read it".

Where evidence comes from:
- patrol questions: the ground-truth event the answer is taken from (the sighting, the
  utterance, the action result), at its bag time, holding its object / words / result;
- AMA-Bench questions: the steps the question names ("at step 76", "from step 1 to step 8",
  "until step 106", "before step 78"): `steps_named`;
- questions files: an optional `evidence_t_s` list (numbers, or {"t_s", "source"} objects).
A question without evidence is left out of the coverage fraction.

Pure.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from csr_ros.errors import ConfigError

Key = tuple[str, int]                      # (source, stamp_ns) of an observation's chunks
MATCH_TOLERANCE_S = 1.0                    # an evidence time finds observations this close


@dataclass(frozen=True)
class Evidence:
    t_s: float                 # when the observation was made, on the episode's clock
    source: str = ""           # only observations of this source ("" = any)
    contains: str = ""         # only observations whose text holds this ("" = any)
    exact: bool = False        # the observation is at exactly t_s (AMA steps)


def _folded(text: str) -> str:
    return " ".join(text.lower().replace("_", " ").split())


def resolve(evidence: Sequence[Evidence], observations: Sequence, *,
            where: str = "question") -> frozenset[Key]:
    """The observation keys `evidence` names: for each item, the history observations (not
    instant ones) of its source holding its text, nearest to its time (within
    MATCH_TOLERANCE_S; exact items only at that time). A ConfigError names an item that
    matches nothing."""
    history = [o for o in observations if not o.instant]
    keys: set[Key] = set()
    for item in evidence:
        wanted = _folded(item.contains)
        candidates = [o for o in history
                      if (not item.source or o.source == item.source)
                      and (not wanted or wanted in _folded(o.text))]
        if item.exact:
            found = [o for o in candidates if o.t_s == item.t_s]
        else:
            near = [(abs(o.t_s - item.t_s), o) for o in candidates
                    if abs(o.t_s - item.t_s) <= MATCH_TOLERANCE_S]
            best = min((d for d, _ in near), default=None)
            found = [o for d, o in near if d == best]
        if not found:
            what = " ".join(filter(None, [f"source {item.source!r}" if item.source else "",
                                          f"holding {item.contains!r}" if item.contains else ""]))
            raise ConfigError(f"{where}: no observation {what} at t_s={item.t_s:g} for its "
                              "evidence" + ("" if item.exact else
                                            f" (within {MATCH_TOLERANCE_S:g} s)"))
        keys.update((o.source, o.stamp_ns) for o in found)
    return frozenset(keys)


def covered(keys: frozenset[Key], prompt_chunks: Iterable, seen: Counter) -> bool:
    """Every chunk made from the evidence observations (`seen` counts the chunks per key the
    method was given) is among `prompt_chunks`."""
    in_prompt = Counter((c.source, c.stamp_ns) for c in prompt_chunks)
    return all(seen[key] > 0 and in_prompt[key] >= seen[key] for key in keys)


# -- steps named in an AMA-Bench question --------------------------------------------------------

_N = r"(\d+)"
_RANGE = re.compile(rf"\b(?:from|between)\s+steps?\s+{_N}\s+(?:to|and|through|until)\s+"
                    rf"(?:step\s+)?{_N}|\bsteps\s+{_N}\s*(?:-|–|to|through)\s*{_N}", re.I)
_UNTIL = re.compile(rf"\b(?:until|up\s+to|through|by|till)\s+step\s+{_N}", re.I)
_BEFORE = re.compile(rf"\bbefore\s+step\s+{_N}", re.I)
_AFTER = re.compile(rf"\b(?:after|since)\s+step\s+{_N}", re.I)
_AT = re.compile(rf"\bsteps?\s+{_N}", re.I)


def steps_named(question: str, last_step: int) -> tuple[int, ...]:
    """The steps whose observations a question asks about, clipped to 0..last_step:
    "from step a to step b" / "between step a and step b" / "steps a-b": a..b; "until
    step n" (up to, through, by): 0..n; "before step n": 0..n-1; "after step n": n+1..last;
    any other "step n": n. () when the question names no step ("throughout the trajectory")."""
    steps: set[int] = set()
    text = question

    def take(pattern, to_range) -> None:
        nonlocal text
        for m in pattern.finditer(text):
            numbers = [int(g) for g in m.groups() if g is not None]
            lo, hi = to_range(*numbers)
            steps.update(range(max(0, lo), min(hi, last_step) + 1))
        text = pattern.sub(" ", text)

    take(_RANGE, lambda a, b: (min(a, b), max(a, b)))
    take(_UNTIL, lambda n: (0, n))
    take(_BEFORE, lambda n: (0, n - 1))
    take(_AFTER, lambda n: (n + 1, last_step))
    take(_AT, lambda n: (n, n))
    return tuple(sorted(steps))


def evidence_from_record(value: object, *, where: str) -> tuple[Evidence, ...]:
    """A questions file's `evidence_t_s`: a list of seconds, or of {"t_s", "source"?}."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{where}: evidence_t_s must be a list of times in seconds")
    items = []
    for entry in value:
        source = ""
        if isinstance(entry, dict):
            source = str(entry.get("source") or "")
            entry = entry.get("t_s")
        if isinstance(entry, bool) or not isinstance(entry, (int, float)) or entry < 0:
            raise ConfigError(f"{where}: evidence_t_s entries are times >= 0 in seconds (or "
                              f'{{"t_s": ..., "source": ...}}), got {entry!r}')
        items.append(Evidence(t_s=float(entry), source=source))
    return tuple(items)
