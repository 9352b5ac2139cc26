{{ config(meta={'dagster': {'ref': {'name': 'agg_tenant_capacity_cost'}}}) }}
-- The tenant allocation of each pool-period (idle share or `__idle__` line) adds up to the
-- pool's capacity cost exactly, and each line is its used cost plus its idle share.
with allocated as (
    select pool_id, period_grain, period_start_utc, sum(allocated_capacity_cost) as allocated
    from {{ ref('agg_tenant_capacity_cost') }} group by 1, 2, 3
),
pools as (
    select pool_id, period_grain, period_start_utc, capacity_cost
    from {{ ref('agg_pool_economics') }} where capacity_cost <> 0
)
select coalesce(a.pool_id, p.pool_id) as pool_id, coalesce(a.period_start_utc, p.period_start_utc) as period_start_utc,
       a.allocated, p.capacity_cost
from allocated as a
full outer join pools as p using (pool_id, period_grain, period_start_utc)
where coalesce(a.allocated, 0) <> coalesce(p.capacity_cost, 0)
union all
select pool_id, period_start_utc, allocated_capacity_cost, used_capacity_cost + idle_cost_share
from {{ ref('agg_tenant_capacity_cost') }}
where allocated_capacity_cost <> used_capacity_cost + idle_cost_share
