"""The control loop's tick job. Asset jobs select their assets by key or group (no asset
module is imported for it)."""

import dagster as dg

# The repricing tick: inventory -> demand -> forecast -> prices -> price book -> scaling
# plan -> drain requests. Drains and scaling actions run in their own sensor-launched jobs
# (drains/jobs.py, scaling/jobs.py).
control_loop_job = dg.define_asset_job(
    "control_loop_job",
    selection=dg.AssetSelection.groups("fleet", "market", "scaling", "drain"),
    description="One control-loop tick over the whole fleet.",
)
