{{ config(materialized='view') }}
-- Powered GPU-seconds per pool and hour, observed from the fleet snapshots the control loop
-- writes every tick (pool_demand_snapshots.gpus_on: GPUs on nodes in state `on`). A
-- snapshot holds until the pool's next one, but at most var fleet_snapshot_hold_minutes
-- (default 60): a longer gap (the loop was down) is not counted as powered; nor is any time
-- after the latest snapshot of the fleet (its present; the next run extends it). Billed use
-- in such a gap still counts (agg_pool_economics: powered >= sold).
with snapshots as (
    select
        pool_id,
        gpus_on,
        {{ utc_naive('ts') }} as span_start,
        least(
            coalesce(lead({{ utc_naive('ts') }}) over (partition by pool_id order by ts),
                     {{ utc_naive('ts') }} + to_minutes({{ var('fleet_snapshot_hold_minutes') | int }})),
            {{ utc_naive('ts') }} + to_minutes({{ var('fleet_snapshot_hold_minutes') | int }}),
            max({{ utc_naive('ts') }}) over ()
        ) as span_end
    from {{ source('warehouse', 'pool_demand_snapshots') }}
),

hours as (
    select
        pool_id,
        gpus_on,
        span_start,
        span_end,
        unnest(generate_series(date_trunc('hour', span_start), span_end - interval 1 microsecond,
                               interval 1 hour)) as hour_utc
    from snapshots
    where span_end > span_start and gpus_on > 0
)

select
    pool_id,
    hour_utc,
    cast(sum(gpus_on * date_diff('second', greatest(span_start, hour_utc),
                                 least(span_end, hour_utc + interval 1 hour))) as bigint)
        as observed_gpu_seconds
from hours
group by pool_id, hour_utc
