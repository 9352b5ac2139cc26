"""Guardrails: queue-level backlog drainability, the tick's price certificate (`backlog`).

The task drains (node-level task drainability) are their own package, `market_pipeline.drain`.
Import the concrete modules directly; this package re-exports nothing.
"""
