{{ config(materialized='window_table',
          window_column='charge_period_hour', window_grain='hour') }}
-- SLA credits for platform-caused failures: a task whose final usage interval ended with
-- platform_fault (a platform-caused drain failure, or a failure from unavailability of the
-- node/GPU) is credited sla_credit_rate x the billed cost of its usage in the
-- sla_credit_window_seconds before the fault (the work the fault destroyed). The affected
-- cost is the overlapping billed GPU-seconds at each rated row's effective unit price.
-- ChargeCategory `Credit`; the credit lands in the hour of the fault.
with terms as (
    select * from {{ ref('stg_billing_terms') }}
),

faults as (
    select
        task_id,
        tenant_id,
        pool_id,
        gpu_model,
        zone,
        resource_class,
        usage_hour as charge_period_hour,
        max(end_reason) as end_reason,
        max(ended_at_utc) as fault_at_utc
    from {{ ref('stg_usage_intervals') }}
    where platform_fault and {{ usage_in_window() }}
    group by task_id, tenant_id, pool_id, gpu_model, zone, resource_class, usage_hour
),

scoped as (
    select
        f.*,
        f.fault_at_utc - to_seconds((select sla_credit_window_seconds from terms)) as credit_from_utc
    from faults as f
),

-- the faulted tasks' usage, rated like int_rated_usage but only for these few tasks (filtered
-- on the raw table, before the per-row conversions of stg_usage_intervals/int_usage_billed)
fault_rated as (
    {%- set fault_tasks = "(select * from " ~ source('warehouse', 'usage_intervals')
                          ~ " where task_id in (select task_id from faults))" %}
    {{ rated_rows("(" ~ billed_usage("(" ~ usage_interval_columns(fault_tasks) ~ ")") ~ ")") }}
),

affected as (
    select
        s.task_id,
        s.fault_at_utc,
        r.gpu_fraction_e4,
        {{ effective_unit_nano('r') }} as effective_unit_nano,
        greatest(0, date_diff('second',
            greatest(r.rated_start_utc, s.credit_from_utc),
            least(r.rated_start_utc + to_seconds(r.billed_seconds), s.fault_at_utc))) as overlap_seconds
    from scoped as s
    join fault_rated as r
        on r.task_id = s.task_id
        and r.usage_hour >= date_trunc('hour', s.credit_from_utc)
        and r.usage_hour <= s.charge_period_hour
        and r.rated_start_utc + to_seconds(r.billed_seconds) > s.credit_from_utc
        and r.rated_start_utc < s.fault_at_utc
),

costed as (
    -- few rows: HUGEINT keeps large prices from overflowing. GPU-seconds x 1e4 times a unit
    -- price in nano-units per GPU-hour, / (3600 x 1e4) -> nano-units
    select
        task_id,
        fault_at_utc,
        sum(overlap_seconds) as credited_seconds,
        sum(overlap_seconds * gpu_fraction_e4) as credited_gpu_seconds_e4,
        sum({{ rdiv('cast(overlap_seconds * gpu_fraction_e4 as hugeint) * effective_unit_nano', '36000000') }})
            as affected_nano
    from affected
    group by task_id, fault_at_utc
),

amounts as (
    select
        s.*,
        coalesce(c.credited_seconds, 0) as credited_seconds,
        coalesce(c.credited_gpu_seconds_e4, 0) as credited_gpu_seconds_e4,
        coalesce(c.affected_nano, 0) as affected_nano,
        {{ rdiv('coalesce(c.affected_nano, 0) * ' ~ e6('(select sla_credit_rate from terms)'), '1000000') }}
            as credit_nano
    from scoped as s
    left join costed as c
        on c.task_id = s.task_id and c.fault_at_utc = s.fault_at_utc
)

select
    task_id || '@' || strftime(fault_at_utc, '%Y-%m-%dT%H:%M:%S') as credit_id,
    tenant_id,
    task_id,
    pool_id,
    gpu_model,
    zone,
    resource_class,
    end_reason,
    {{ utc_tz("fault_at_utc") }} as fault_at,
    charge_period_hour,
    {{ utc_tz("charge_period_hour") }} as charge_period_start,
    {{ utc_tz("charge_period_hour + interval 1 hour") }} as charge_period_end,
    cast(credited_seconds as bigint) as credited_seconds,
    {{ int_to_decimal('cast(credited_gpu_seconds_e4 as bigint)', 4) }} as credited_gpu_seconds,
    {{ nano_to_money('affected_nano') }} as affected_cost,
    (select sla_credit_rate from terms) as sla_credit_rate,
    {{ nano_to_money('credit_nano') }} as credit_amount,
    -{{ nano_to_money('credit_nano') }} as billed_cost,
    (select currency from terms) as currency
from amounts
