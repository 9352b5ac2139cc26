"""Bad input as one `error:` line and exit status 2: what every subcommand shares. It imports
nothing of the domain, so the pure packages' commands (market, forecast) may use it."""

from __future__ import annotations

import sys

# Bad input: one line on stderr, from the command itself (the CLI's contract, README "CLI").
INPUT_ERROR = 2


def input_error(problem: object) -> int:
    """Print `error: <problem>` on stderr; returns the exit status for bad input."""
    print(f"error: {problem}", file=sys.stderr)
    return INPUT_ERROR
