{{ config(materialized='table') }}
-- Pool economics per pool and hour, and per pool and day (sums of its hours): powered,
-- sold and idle GPU-hours, what the powered capacity cost the platform, revenue and margin.
--   powered_gpu_hours = max(observed powered GPU-hours, sold GPU-hours): a GPU that ran
--     billed work was powered, so where the per-tick snapshots saw fewer (a node switched
--     off mid-tick, a tick the loop missed) the sold hours count; `unobserved_gpu_hours`
--     says how much that added.
--   capacity_cost = round(powered_gpu_hours x cost per GPU-hour of the pool's GPU model, 9)
--     (billing_rate_card_gpu_costs, from the config at billing time)
--   revenue = the pool's invoice lines (usage less SLA credits); margin = revenue - capacity_cost
--   utilisation = sold / powered (6 decimals; null when nothing was powered)
-- A full rebuild: it reads the (small) hourly invoice lines and the per-tick fleet snapshots.
with lines as (
    select
        pool_id,
        period_start_utc as hour_utc,
        sum(case when charge_category = 'Usage' and resource_class = 'guaranteed'
                 then consumed_gpu_hours else 0 end) as sold_guaranteed_gpu_hours,
        sum(case when charge_category = 'Usage' and resource_class = 'drainable'
                 then consumed_gpu_hours else 0 end) as sold_drainable_gpu_hours,
        sum(case when charge_category = 'Usage' then billed_cost else 0 end) as usage_revenue,
        sum(case when charge_category = 'Credit' then billed_cost else 0 end) as sla_credits,
        sum(billed_cost) as revenue,
        max(gpu_model) as gpu_model,
        max(zone) as zone
    from {{ ref('fct_invoice_lines') }}
    where period_grain = 'hour'
    group by pool_id, period_start_utc
),

observed as (
    select pool_id, hour_utc, observed_gpu_seconds from {{ ref('int_pool_capacity_hours') }}
),

pool_hours as (
    select pool_id, hour_utc from lines
    union
    select pool_id, hour_utc from observed
),

pools as (
    -- the pool's GPU model and zone: the rate card, else the invoice lines, else its id
    select pool_id, gpu_model, zone from {{ source('warehouse', 'billing_rate_card_pools') }}
),

hourly as (
    select
        h.pool_id,
        coalesce(p.gpu_model, l.gpu_model, split_part(h.pool_id, '@', 1)) as gpu_model,
        coalesce(p.zone, l.zone, split_part(h.pool_id, '@', 2)) as zone,
        h.hour_utc,
        {{ nano_to_money(rdiv('coalesce(o.observed_gpu_seconds, 0) * 1000000000', '3600')) }}
            as observed_gpu_hours,
        cast(coalesce(l.sold_guaranteed_gpu_hours, 0) as decimal(38, 9)) as sold_guaranteed_gpu_hours,
        cast(coalesce(l.sold_drainable_gpu_hours, 0) as decimal(38, 9)) as sold_drainable_gpu_hours,
        cast(coalesce(l.usage_revenue, 0) as decimal(38, 9)) as usage_revenue,
        cast(coalesce(l.sla_credits, 0) as decimal(38, 9)) as sla_credits,
        cast(coalesce(l.revenue, 0) as decimal(38, 9)) as revenue
    from pool_hours as h
    left join lines as l using (pool_id, hour_utc)
    left join observed as o using (pool_id, hour_utc)
    left join pools as p using (pool_id)
),

priced as (
    select
        h.*,
        cast(h.sold_guaranteed_gpu_hours + h.sold_drainable_gpu_hours as decimal(38, 9)) as sold_gpu_hours,
        cast(greatest(h.observed_gpu_hours, h.sold_guaranteed_gpu_hours + h.sold_drainable_gpu_hours)
             as decimal(38, 9)) as powered_gpu_hours,
        c.cost_per_gpu_hour
    from hourly as h
    left join {{ source('warehouse', 'billing_rate_card_gpu_costs') }} as c using (gpu_model)
),

hour_rows as (
    select
        'hour' as period_grain,
        hour_utc as period_start_utc,
        hour_utc + interval 1 hour as period_end_utc,
        pool_id,
        gpu_model,
        zone,
        cost_per_gpu_hour,
        observed_gpu_hours,
        powered_gpu_hours,
        cast(powered_gpu_hours - observed_gpu_hours as decimal(38, 9)) as unobserved_gpu_hours,
        sold_gpu_hours,
        sold_guaranteed_gpu_hours,
        sold_drainable_gpu_hours,
        cast(powered_gpu_hours - sold_gpu_hours as decimal(38, 9)) as idle_gpu_hours,
        {{ money_times_rate('powered_gpu_hours', 'cost_per_gpu_hour') }} as capacity_cost,
        usage_revenue,
        sla_credits,
        revenue
    from priced
),

day_rows as (
    select
        'day' as period_grain,
        date_trunc('day', period_start_utc) as period_start_utc,
        date_trunc('day', period_start_utc) + interval 1 day as period_end_utc,
        pool_id,
        any_value(gpu_model) as gpu_model,
        any_value(zone) as zone,
        max(cost_per_gpu_hour) as cost_per_gpu_hour,
        sum(observed_gpu_hours) as observed_gpu_hours,
        sum(powered_gpu_hours) as powered_gpu_hours,
        sum(unobserved_gpu_hours) as unobserved_gpu_hours,
        sum(sold_gpu_hours) as sold_gpu_hours,
        sum(sold_guaranteed_gpu_hours) as sold_guaranteed_gpu_hours,
        sum(sold_drainable_gpu_hours) as sold_drainable_gpu_hours,
        sum(idle_gpu_hours) as idle_gpu_hours,
        sum(capacity_cost) as capacity_cost,
        sum(usage_revenue) as usage_revenue,
        sum(sla_credits) as sla_credits,
        sum(revenue) as revenue
    from hour_rows
    group by date_trunc('day', period_start_utc), pool_id
),

all_rows as (
    select * from hour_rows
    union all by name
    select * from day_rows
)

select
    {{ period_row_id('pool_id') }} as economics_row_id,
    {{ period_columns() }},
    pool_id,
    gpu_model,
    zone,
    cast(cost_per_gpu_hour as decimal(18, 6)) as cost_per_gpu_hour,
    cast(powered_gpu_hours as decimal(38, 9)) as powered_gpu_hours,
    cast(observed_gpu_hours as decimal(38, 9)) as observed_gpu_hours,
    cast(unobserved_gpu_hours as decimal(38, 9)) as unobserved_gpu_hours,
    cast(sold_gpu_hours as decimal(38, 9)) as sold_gpu_hours,
    cast(sold_guaranteed_gpu_hours as decimal(38, 9)) as sold_guaranteed_gpu_hours,
    cast(sold_drainable_gpu_hours as decimal(38, 9)) as sold_drainable_gpu_hours,
    cast(idle_gpu_hours as decimal(38, 9)) as idle_gpu_hours,
    cast(capacity_cost as decimal(38, 9)) as capacity_cost,
    cast(usage_revenue as decimal(38, 9)) as usage_revenue,
    cast(sla_credits as decimal(38, 9)) as sla_credits,
    cast(revenue as decimal(38, 9)) as revenue,
    cast(revenue - capacity_cost as decimal(38, 9)) as margin,
    {{ decimal_ratio('sold_gpu_hours', 'powered_gpu_hours') }} as utilisation,
    (select currency from {{ ref('stg_billing_terms') }}) as currency
from all_rows
