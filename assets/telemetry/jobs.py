"""The telemetry job. Asset jobs select their assets by key or group: no asset module is
imported for it."""

import dagster as dg

# One hour of telemetry per partition: samples in, checks on them.
telemetry_job = dg.define_asset_job(
    "telemetry_job",
    selection=dg.AssetSelection.assets("telemetry_samples"),
    description="Ingest and check one hour of per-GPU samples.",
)
