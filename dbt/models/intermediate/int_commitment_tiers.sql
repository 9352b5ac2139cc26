{{ config(materialized='window_table',
          window_column='usage_hour', window_grain='hour') }}
-- Commitment tier per tenant and rated hour, stored when the hour is rated: the tier
-- reached by the tenant's billed GPU-hours earlier in the same calendar month (UTC), before
-- this hour. A tier applies from the hour after it is reached, so an hour's rate never
-- depends on its own usage. Earlier hours of the month only feed the running total.
with hourly as (
    select
        tenant_id,
        usage_hour,
        sum(billable_seconds * gpu_fraction_e4) as gpu_seconds_e4
    from {{ ref('int_usage_billed') }}
    where {{ usage_in_window(lo="date_trunc('month', " ~ window_start() ~ ")") }}
    group by tenant_id, usage_hour
),

cumulative as (
    select
        tenant_id,
        usage_hour,
        cast(coalesce(sum(gpu_seconds_e4) over (
            partition by tenant_id, date_trunc('month', usage_hour)
            order by usage_hour
            rows between unbounded preceding and 1 preceding), 0) as bigint) as mtd_gpu_seconds_e4
    from hourly
),

tiers as (
    select cast(min_gpu_hours * 36000000 as bigint) as min_gpu_seconds_e4, min_gpu_hours, discount
    from {{ source('warehouse', 'billing_commitment_tiers') }}
)

select
    c.tenant_id,
    c.usage_hour,
    c.mtd_gpu_seconds_e4,
    coalesce(t.min_gpu_hours, 0) as commitment_tier_min_gpu_hours,
    coalesce(t.discount, 0) as commitment_discount_rate,
    {{ e6('coalesce(t.discount, 0)') }} as commitment_discount_e6
from cumulative as c
asof left join tiers as t
    on c.mtd_gpu_seconds_e4 >= t.min_gpu_seconds_e4
where {{ in_window('c.usage_hour') }}
