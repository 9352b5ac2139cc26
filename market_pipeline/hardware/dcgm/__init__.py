"""The `dcgm` backend: dcgm-exporter's /metrics exposition, read from URLs or files.

`adapter.DcgmAdapter` is the backend; `exposition` parses the Prometheus text into per-GPU
(and per-MIG) readings. Import the concrete modules directly; this package re-exports nothing.
"""
