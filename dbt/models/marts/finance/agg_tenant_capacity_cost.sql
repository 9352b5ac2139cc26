{{ config(materialized='table') }}
-- Each pool-hour's capacity cost (agg_pool_economics) allocated to tenants, OpenCost style,
-- per the config's [billing] idle_cost_allocation (dbt var):
--   used_capacity_cost: the tenant's sold GPU-hours x the pool's cost per GPU-hour;
--   'proportional': the idle capacity is shared in proportion to sold GPU-hours, so each
--     tenant carries capacity_cost x its share of sold GPU-hours (its used cost plus its
--     idle_cost_share);
--   'idle_line': tenants carry their used cost; the idle capacity is one `__idle__` line.
-- A pool-hour nobody used goes to `__idle__` in either mode. Amounts are exact integer
-- nano-units; the rounding remainder of a pool-hour goes to its largest user, so the lines
-- of every pool-hour add up to its capacity_cost exactly. Day rows sum the hours.
{%- set mode = idle_cost_allocation() %}
with pools as (
    select
        pool_id, period_start_utc, cost_per_gpu_hour,
        {{ money_to_nano('capacity_cost') }} as capacity_nano,
        {{ money_to_nano('sold_gpu_hours') }} as pool_sold_nano
    from {{ ref('agg_pool_economics') }}
    where period_grain = 'hour'
),

usage as (
    select
        tenant_id, pool_id, period_start_utc,
        sum(consumed_gpu_hours) as sold_gpu_hours
    from {{ ref('fct_invoice_lines') }}
    where period_grain = 'hour' and charge_category = 'Usage'
    group by tenant_id, pool_id, period_start_utc
    having sum(consumed_gpu_hours) > 0
),

tenant_shares as (
    select
        u.tenant_id, u.pool_id, u.period_start_utc,
        cast(u.sold_gpu_hours as decimal(38, 9)) as sold_gpu_hours,
        {{ money_to_nano(money_times_rate('u.sold_gpu_hours', 'p.cost_per_gpu_hour')) }} as used_nano,
        {%- if mode == 'proportional' %}
        {{ rdiv('p.capacity_nano * ' ~ money_to_nano('u.sold_gpu_hours'), 'p.pool_sold_nano') }} as share_nano,
        {%- else %}
        {{ money_to_nano(money_times_rate('u.sold_gpu_hours', 'p.cost_per_gpu_hour')) }} as share_nano,
        {%- endif %}
        row_number() over (partition by u.pool_id, u.period_start_utc
                           order by u.sold_gpu_hours desc, u.tenant_id) as rank_in_pool
    from usage as u
    join pools as p using (pool_id, period_start_utc)
),

remainders as (
    select
        p.pool_id, p.period_start_utc,
        p.capacity_nano - coalesce(sum(s.share_nano), 0) as remainder_nano,
        count(s.tenant_id) as tenants
    from pools as p
    left join tenant_shares as s using (pool_id, period_start_utc)
    group by p.pool_id, p.period_start_utc, p.capacity_nano
),

tenant_lines as (
    select
        s.tenant_id, s.pool_id, s.period_start_utc, s.sold_gpu_hours, s.used_nano,
        {%- if mode == 'proportional' %}
        s.share_nano + case when s.rank_in_pool = 1 then r.remainder_nano else 0 end as allocated_nano
        {%- else %}
        s.share_nano as allocated_nano
        {%- endif %}
    from tenant_shares as s
    join remainders as r using (pool_id, period_start_utc)
),

idle_lines as (
    -- the `__idle__` line: the idle capacity (idle_line mode), or a pool-hour nobody used
    select
        '__idle__' as tenant_id, pool_id, period_start_utc,
        cast(0 as decimal(38, 9)) as sold_gpu_hours,
        cast(0 as hugeint) as used_nano,
        remainder_nano as allocated_nano
    from remainders
    where {{ "true" if mode == 'idle_line' else "tenants = 0" }} and remainder_nano <> 0
),

hour_rows as (
    select
        'hour' as period_grain,
        period_start_utc,
        period_start_utc + interval 1 hour as period_end_utc,
        tenant_id, pool_id, sold_gpu_hours,
        {{ nano_to_money_wide('used_nano') }} as used_capacity_cost,
        {{ nano_to_money_wide('allocated_nano - used_nano') }} as idle_cost_share,
        {{ nano_to_money_wide('allocated_nano') }} as allocated_capacity_cost
    from (select * from tenant_lines union all by name select * from idle_lines)
),

day_rows as (
    select
        'day' as period_grain,
        date_trunc('day', period_start_utc) as period_start_utc,
        date_trunc('day', period_start_utc) + interval 1 day as period_end_utc,
        tenant_id, pool_id,
        sum(sold_gpu_hours) as sold_gpu_hours,
        sum(used_capacity_cost) as used_capacity_cost,
        sum(idle_cost_share) as idle_cost_share,
        sum(allocated_capacity_cost) as allocated_capacity_cost
    from hour_rows
    group by date_trunc('day', period_start_utc), tenant_id, pool_id
)

select
    {{ period_row_id('tenant_id', ['pool_id']) }} as allocation_row_id,
    {{ period_columns() }},
    tenant_id,
    pool_id,
    '{{ mode }}' as idle_cost_allocation,
    cast(sold_gpu_hours as decimal(38, 9)) as sold_gpu_hours,
    cast(used_capacity_cost as decimal(38, 9)) as used_capacity_cost,
    cast(idle_cost_share as decimal(38, 9)) as idle_cost_share,
    cast(allocated_capacity_cost as decimal(38, 9)) as allocated_capacity_cost
from (select * from hour_rows union all by name select * from day_rows)
