{#- The usage interval columns (stg_usage_intervals) over a relation with the columns of the
    `usage_intervals` source, and the billing cut-off (int_usage_billed) over a relation
    with those columns. Macros, so that fct_sla_credits can apply the same logic to the few
    intervals of faulted tasks, filtered before the per-row conversions. -#}
{% macro usage_interval_columns(relation) -%}
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
from {{ relation }}
{%- endmacro %}

{#- Where billing of each interval stops: at its end, or -- after a drain signal -- at the
    signal plus the grace period, whichever is first (never before the interval's start).
    After the grace period billing stops whether the task is then drained, exits or fails. -#}
{% macro billed_usage(relation) -%}
select
    *,
    date_diff('second', started_at_utc, billed_end_utc) as billable_seconds,
    -- for joining price segments: a zero-length interval still finds the segment it is in
    greatest(billed_end_utc, started_at_utc + interval 1 microsecond) as billed_probe_end_utc
from (
    select
        u.*,
        case
            when u.drain_signal_at_utc is null then u.ended_at_utc
            else least(
                u.ended_at_utc,
                greatest(u.started_at_utc,
                         u.drain_signal_at_utc
                         + to_seconds((select grace_seconds from {{ ref('stg_billing_terms') }})))
            )
        end as billed_end_utc
    from {{ relation }} as u
)
{%- endmacro %}
