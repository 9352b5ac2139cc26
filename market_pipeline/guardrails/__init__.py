"""Guardrails: queue-level backlog drainability and node-level task drainability.

Import the concrete modules (`market_pipeline.guardrails.backlog`, ...) directly; this
package re-exports nothing so each guardrail stays independent.
"""
