"""The hourly partitions telemetry, metering and billing share.

They begin where the fleet's history begins (the simulated twin's epoch), so the UI shows
the hours the fleet lived and a backfill of "all" is that history. A partitions definition
is needed when the assets are declared, so this one reads the history start (the config's
fleet section, or the epoch a new twin would get when the config does not load) on import.
"""

import dagster as dg

from market_pipeline.fleet.history import configured_history_start
from market_pipeline.telemetry.partitions import PARTITION_FORMAT

HOURLY_PARTITIONS = dg.HourlyPartitionsDefinition(
    start_date=configured_history_start().strftime(PARTITION_FORMAT)
)
# Backfills of the billing assets run as one run per range: metering loops over the hours,
# dbt rebuilds the whole range's window at once.
SINGLE_RUN = dg.BackfillPolicy.single_run()
