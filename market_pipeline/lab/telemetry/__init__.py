"""Telemetry offline: synthetic samples (`synthetic`), `bench ingest` and `bench telemetry-checks`."""
