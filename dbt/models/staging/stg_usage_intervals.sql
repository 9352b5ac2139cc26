-- Metered usage, one row per task, GPU and hour, with its metered seconds.
-- *_utc columns are naive UTC timestamps for hour/day arithmetic.
select
    interval_id,
    task_id,
    tenant_id,
    pool_id,
    gpu_model,
    zone,
    resource_class,
    node_id,
    gpu_uuid,
    gpu_fraction,
    cast(gpu_fraction * 10000 as bigint) as gpu_fraction_e4,
    mig_profile,
    mem_mib,
    started_at,
    ended_at,
    end_reason,
    drain_signal_at,
    platform_fault,
    partition_key,
    {{ utc_naive('started_at') }} as started_at_utc,
    {{ utc_naive('ended_at') }} as ended_at_utc,
    {{ utc_naive('drain_signal_at') }} as drain_signal_at_utc,
    date_trunc('hour', {{ utc_naive('started_at') }}) as usage_hour,
    (epoch_us(ended_at) - epoch_us(started_at)) // 1000000 as metered_seconds,
    cast((epoch_us(ended_at) - epoch_us(started_at)) // 1000000 * gpu_fraction as decimal(18, 4))
        as metered_gpu_seconds,
    cast(mem_mib as bigint) * ((epoch_us(ended_at) - epoch_us(started_at)) // 1000000)
        as metered_mem_mib_seconds
from {{ source('warehouse', 'usage_intervals') }}
