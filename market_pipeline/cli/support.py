"""Bad input as one `error:` line and exit status 2: what every subcommand shares. It imports
nothing of the domain, so the pure packages' commands (market, forecast) may use it."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any, NoReturn

# Bad input: one line on stderr, from the command itself (the CLI's contract, README "CLI").
INPUT_ERROR = 2


def input_error(problem: object) -> int:
    """Print `error: <problem>` on stderr; returns the exit status for bad input."""
    print(f"error: {one_line(problem)}", file=sys.stderr)
    return INPUT_ERROR


def bench_counts(workers: str, rounds: int, most: int) -> tuple[int, ...]:
    """`--workers` (comma-separated counts in 1..most) and `--rounds` (1..20) of a scale bench;
    ValueError naming the one that is wrong."""
    try:
        counts = tuple(int(w) for w in workers.split(","))
    except ValueError:
        raise ValueError(f"--workers must be comma-separated counts, got {workers!r}") from None
    if not counts or not all(1 <= w <= most for w in counts):
        raise ValueError(f"--workers must be counts in 1..{most}, got {workers!r}")
    if not 1 <= rounds <= 20:
        raise ValueError(f"--rounds must be in 1..20, got {rounds}")
    return counts


def one_line(problem: object, limit: int = 400) -> str:
    """A problem's text as one line: its first line (a library's multi-line message adds a
    plan or a hint below), blanks collapsed, at most `limit` characters."""
    lines = [line for line in str(problem).splitlines() if line.strip()]
    text = " ".join(lines[0].split()) if lines else type(problem).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as the CLI's one `error:` line (the usage is in --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(INPUT_ERROR, f"error: {self.prog}: {message} (see --help)\n")


def number(
    kind: type = float,
    *,
    low: float | None = 0,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> Callable[[str], Any]:
    """An argparse `type` for a finite number inside [low, high] (open ends where asked):
    "nan", "inf", a negative count or a probability of 1.5 is refused by name, one line."""
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    span = f"{left}{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}{right}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be in {span}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in "invalid <name> value"
    parse.numeric = True  # type: ignore[attr-defined]
    return parse


# Every int/float option the subcommands declare with a bare `type=int`/`type=float` gets this:
# finite and not negative (no option of the CLI means anything below zero). An option that
# needs a tighter range declares its own `number(...)`.
DEFAULT_NUMBER = {float: number(float), int: number(int)}


def bound_numbers(parser: argparse.ArgumentParser) -> None:
    """Give every bare int/float option of `parser` and its subcommands `DEFAULT_NUMBER`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                bound_numbers(sub)
        elif action.type in DEFAULT_NUMBER:
            action.type = DEFAULT_NUMBER[action.type]
