"""The billing job (selects the billing group: no asset module is imported for it)."""

import dagster as dg

billing_job = dg.define_asset_job(
    "billing_job",
    selection=dg.AssetSelection.groups("billing"),
    description="Meter, rate (dbt build with tests), post balances and evaluate budget guards.",
)
