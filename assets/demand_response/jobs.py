"""The demand-response refit job (selects its asset by key)."""

import dagster as dg

# Its own job: the control tick does not refit the demand response every tick.
demand_response_job = dg.define_asset_job(
    "demand_response_job", selection=dg.AssetSelection.assets("demand_response")
)
