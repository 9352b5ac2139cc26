"""Billing errors: each names the task, tenant, table or key at fault."""

from __future__ import annotations


class BillingError(ValueError):
    """Bad billing input; the message names the offending field, key or row."""


class MeteringError(BillingError):
    """Task events or the task catalog cannot be turned into usage intervals."""


class RatingError(BillingError):
    """The dbt rollup failed or produced inconsistent totals."""


class QuoteError(BillingError):
    """A quote was asked for an unknown tenant, pool, class or horizon."""
