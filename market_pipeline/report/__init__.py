"""What the operator reads: small PNG charts for asset metadata and the loop's summary."""
