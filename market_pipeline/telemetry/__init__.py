"""Telemetry: canonical samples, validation with quarantine, idempotent hourly ingestion into
the warehouse, data-quality checks (great-expectations) and the operator's heatmap.

Entry points: `ingest.ingest_samples`, `checks.evaluate_partition` (and the single checks),
`schema.read_sample_file`, `heatmap.utilisation_heatmap_png`.
"""
