"""Metering, rating (dbt), invoices, SLA credits, balances, quotes and cost reports."""
