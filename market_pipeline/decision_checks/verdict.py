"""What a decision check says: passed or not, one line why, the rows that broke the rule.

A verdict that did not pass is either a defect (the check fails at ERROR) or an expected
operating outcome (`expected`: a solver fallback to the prices in force, a pool short of
capacity that only an operator can grow): the check warns with its reason and the run stays
green."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Verdict:
    passed: bool
    description: str
    offenders: list[dict[str, object]] = field(default_factory=list)
    numbers: dict[str, float | int] = field(default_factory=dict)  # top-level metadata entries
    expected: bool = False  # not passed, but an expected outcome: warn, do not fail

    @classmethod
    def from_offenders(
        cls, offenders: list[dict[str, object]], ok: str, bad: str, **numbers: float | int
    ) -> "Verdict":
        """Passed when nothing offends; `bad` may use {n}, the count of offenders."""
        if offenders:
            return cls(
                False, bad.replace("{n}", str(len(offenders))), offenders, dict(numbers)
            )  # names may hold braces
        return cls(True, ok, [], dict(numbers))
