"""The fleet offline: `bench fleet-telemetry`, the twin's speed on a large fleet."""
