"""Errors raised by the market engine."""

from __future__ import annotations


class InstanceError(ValueError):
    """A market instance (resources, tenants, settings) is invalid; the message names the field."""


class SolverError(RuntimeError):
    """An internal solver step failed (non-finite values, an unsolvable subproblem)."""
