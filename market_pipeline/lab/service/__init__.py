"""The HTTP service offline: `bench serve` (latency at a fixed rate) and `bench webhooks` (drain warnings
through failing receivers)."""
