"""Numeric ranges as grammars: GBNF rules that admit exactly the numbers of a closed range.

    rules = range_gbnf("a0-1", low=Decimal("-180"), high=Decimal("180"), decimals=0)
    # ['a0-1 ::= a0-1-p1 | ... | "-" ( ... )', 'a0-1-p1 ::= ...', ...]

A grammar cannot compare numbers, but it can compare digits. For a range [low, high] written
with up to `decimals` digits after the point, every accepted string is cut into its sign, its
integer digits and its fraction digits, and for each length of the integer part the rules walk
the digits left to right, remembering only whether the digits so far equal the lower bound's
("tight low") or the upper bound's ("tight high"). A digit strictly between the two frees the
rest; a digit equal to a bound keeps it tight. That is the construction regex-range generators
use, with the fraction added: a fraction may stop early, its missing digits being zeros, only
where that stays at or above the lower bound. The rules grow with the number of digits, never
with the width of the range (`int[-1000000,1000000]` is a few dozen rules).

What the rules admit is `canonical_number` (no leading zeros, no negative zero, 1 to
`decimals` fraction digits when a point is written) whose value lies in [low, high]; nothing
else. The same text is what `Vocabulary.decide()` checks again, so an answer decoded without
the grammar is held to the same range.

Pure: no I/O.
"""

from __future__ import annotations

import re
from decimal import Decimal
from functools import lru_cache


def canonical_number(decimals: int) -> re.Pattern:
    """The number forms the range rules write: `-?(0|[1-9][0-9]*)(\\.[0-9]{1,decimals})?`
    (no fraction when decimals is 0). A negative zero is left out by the rules, not here."""
    fraction = rf"(\.[0-9]{{1,{decimals}}})?" if decimals else ""
    return _compiled(r"-?(0|[1-9][0-9]*)" + fraction)


@lru_cache(maxsize=16)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def range_gbnf(name: str, low: Decimal, high: Decimal, decimals: int) -> list[str]:
    """GBNF rules, the first named `name`, that admit exactly the canonical numbers with at
    most `decimals` fraction digits in [low, high]. `low` and `high` must be written with at
    most `decimals` fraction digits themselves (so that both are admitted)."""
    scale = 10 ** decimals
    lo, hi = _scaled(low, scale), _scaled(high, scale)
    assert lo <= hi, f"an empty range [{low}, {high}]"
    rules: dict[str, str] = {}
    branches = []
    if hi >= 0:
        branches += _unsigned(f"{name}-p", max(lo, 0), hi, decimals, rules)
    if lo < 0:
        # magnitudes from the smallest nonzero one: "-0" and "-0.0" are not numbers we write
        negative = _unsigned(f"{name}-n", max(-hi, 1), -lo, decimals, rules)
        branches.append('"-" ' + _group(negative))
    return [f"{name} ::= " + " | ".join(branches)] + [f"{k} ::= {v}" for k, v in rules.items()]


def _scaled(value: Decimal, scale: int) -> int:
    scaled = Decimal(value) * scale
    assert scaled == scaled.to_integral_value(), f"{value} has more decimals than the range"
    return int(scaled)


def _unsigned(name: str, lo: int, hi: int, decimals: int, rules: dict[str, str]) -> list[str]:
    """One alternative per length of the integer part, for magnitudes lo..hi (scaled, >= 0)."""
    scale = 10 ** decimals
    out = []
    for n in range(len(str(lo // scale)), len(str(hi // scale)) + 1):
        floor = 10 ** (n - 1) * scale if n > 1 else 0     # no leading zero
        lo_n, hi_n = max(lo, floor), min(hi, 10 ** n * scale - 1)
        if lo_n > hi_n:
            continue
        walk = _DigitWalk(f"{name}{n}", str(lo_n).zfill(n + decimals),
                          str(hi_n).zfill(n + decimals), n, decimals, rules)
        out.append(walk.ref(0, True, True))
    return out


class _DigitWalk:
    """The rules for the digit strings between two bounds of the same layout: `n` integer
    digits, then up to `decimals` fraction digits after a point, the missing ones zeros.

    A state is (position, tight low, tight high); each tight state is a rule, a free one an
    inline repetition.
    """

    def __init__(self, name: str, lo: str, hi: str, n: int, decimals: int,
                 rules: dict[str, str]):
        self.name, self.lo, self.hi, self.n, self.decimals = name, lo, hi, n, decimals
        self.end = n + decimals
        self.rules = rules

    def can_end(self, p: int, tight_lo: bool) -> bool:
        """Whether the number may stop before digit p (the rest read as zeros)."""
        if p < self.n:
            return False
        return not tight_lo or set(self.lo[p:]) <= {"0"}

    def ref(self, p: int, tight_lo: bool, tight_hi: bool) -> str:
        """What may follow once digits [0, p) are written: '' at the end, else a non-empty
        expression, made optional where the number may stop here."""
        if p == self.end:
            return ""
        # A bound whose remaining digits are all 0 (low) or all 9 (high) no longer limits.
        tight_lo = tight_lo and set(self.lo[p:]) != {"0"}
        tight_hi = tight_hi and set(self.hi[p:]) != {"9"}
        optional = self.can_end(p, tight_lo)
        if not tight_lo and not tight_hi:
            return self._free(p, optional)
        rule = f"{self.name}-{p}{'l' if tight_lo else ''}{'h' if tight_hi else ''}"
        if rule not in self.rules:
            self.rules[rule] = ""                     # placed first: rules read top-down
            self.rules[rule] = self._tight(p, tight_lo, tight_hi)
        return rule + ("?" if optional else "")

    def _tight(self, p: int, tight_lo: bool, tight_hi: bool) -> str:
        d_lo = int(self.lo[p]) if tight_lo else 0
        d_hi = int(self.hi[p]) if tight_hi else 9
        branches: list[tuple[int, int, str]] = []      # (first digit, last digit, what follows)
        if tight_lo and tight_hi and d_lo == d_hi:
            branches.append((d_lo, d_lo, self.ref(p + 1, True, True)))
        else:
            if tight_lo:
                branches.append((d_lo, d_lo, self.ref(p + 1, True, False)))
            first, last = d_lo + tight_lo, d_hi - tight_hi
            if first <= last:
                branches.append((first, last, self.ref(p + 1, False, False)))
            if tight_hi:
                branches.append((d_hi, d_hi, self.ref(p + 1, False, True)))
        merged = [list(branches[0])]
        for first, last, rest in branches[1:]:
            if rest == merged[-1][2]:
                merged[-1][1] = last                  # neighbours with the same continuation
            else:
                merged.append([first, last, rest])
        body = " | ".join(f"{_digits(first, last)} {rest}".strip()
                          for first, last, rest in merged)
        if p == self.n:                              # the first fraction digit: the point first
            return f'"." {_group([body])}'
        return body

    def _free(self, p: int, optional: bool) -> str:
        """Any digits from p on (only a free integer part must be written in full)."""
        fraction = f'"." [0-9]{_times(1, self.decimals)}' if self.decimals else ""
        if p < self.n:
            whole = f"[0-9]{_times(self.n - p, self.n - p)}"
            return f"{whole} ({fraction})?" if fraction else whole
        if p == self.n:
            return f"({fraction})?" if optional else f"({fraction})"
        return f"[0-9]{_times(0 if optional else 1, self.end - p)}"


def _digits(first: int, last: int) -> str:
    if first == last:
        return f'"{first}"'
    return f"[{first}-{last}]"


def _times(least: int, most: int) -> str:
    if least == most:
        return "" if least == 1 else f"{{{least}}}"
    return f"{{{least},{most}}}"


def _group(branches: list[str]) -> str:
    return branches[0] if len(branches) == 1 and " " not in branches[0] else \
        "(" + " | ".join(branches) + ")"
