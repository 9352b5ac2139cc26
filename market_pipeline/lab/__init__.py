"""Offline tooling (benchmarks, replays, the simulator): drives the live policy code, never the other way round.
The live loop does not import this package (an import-linter contract)."""
