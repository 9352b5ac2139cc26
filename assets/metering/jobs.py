"""The metering job (selects its asset by key: no asset module is imported for it)."""

import dagster as dg

# Metering is its own job: usage_intervals backfills hour ranges in one run
# (BackfillPolicy.single_run) while telemetry_samples takes one hour per run; one job mixing
# both policies makes Dagster warn at every start.
metering_job = dg.define_asset_job(
    "metering_job",
    selection=dg.AssetSelection.assets("usage_intervals"),
    description="Meter one hour of per-second task usage from the adapter's task events.",
)
