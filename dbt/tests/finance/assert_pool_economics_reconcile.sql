{{ config(meta={'dagster': {'ref': {'name': 'agg_pool_economics'}}}) }}
-- Revenue per grain equals the invoice lines of that grain; margin = revenue - capacity_cost
-- exactly on every row; day rows equal the sums of their hours.
with economics as (
    select period_grain, sum(revenue) as revenue from {{ ref('agg_pool_economics') }} group by 1
),
invoice as (
    select period_grain, sum(billed_cost) as billed from {{ ref('fct_invoice_lines') }} group by 1
),
totals as (
    select coalesce(e.period_grain, i.period_grain) as what, e.revenue, i.billed
    from economics as e full outer join invoice as i using (period_grain)
    where e.revenue is distinct from coalesce(i.billed, 0)
),
margins as (
    select economics_row_id as what, revenue, capacity_cost as billed
    from {{ ref('agg_pool_economics') }}
    where margin <> revenue - capacity_cost
),
days as (
    select d.economics_row_id as what, d.capacity_cost as revenue, h.capacity_cost as billed
    from {{ ref('agg_pool_economics') }} as d
    join (select pool_id, date_trunc('day', period_start_utc) as day, sum(capacity_cost) as capacity_cost,
                 sum(powered_gpu_hours) as powered
          from {{ ref('agg_pool_economics') }} where period_grain = 'hour' group by 1, 2) as h
        on h.pool_id = d.pool_id and h.day = d.period_start_utc
    where d.period_grain = 'day' and (d.capacity_cost <> h.capacity_cost or d.powered_gpu_hours <> h.powered)
)
select what, cast(revenue as varchar) as a, cast(billed as varchar) as b from totals
union all select what, cast(revenue as varchar), cast(billed as varchar) from margins
union all select what, cast(revenue as varchar), cast(billed as varchar) from days
