"""The HTTP service (`market-pipeline serve`): the tenant API under /v1, the console, the
operator pages, /metrics and the drain-warning webhooks. It reads the warehouse through
`gate.GatedWarehouse` and keeps its own state (API key hashes, webhooks, deliveries) in a
small SQLite store (`keystore`). Design notes: docs/service.md."""
