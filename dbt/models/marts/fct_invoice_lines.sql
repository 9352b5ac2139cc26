{{ config(materialized='window_table',
          window_column='period_start_utc', window_grain='hour_and_day') }}
-- Invoice lines per tenant, pool, resource class and charge category (Usage, Credit), at
-- two grains: hourly lines for the window's hours and daily lines for the whole days the
-- window touches (recomputed from all rated hours of those days).
with usage_lines as (
    select
        r.tenant_id,
        r.pool_id,
        p.gpu_model,
        p.zone,
        r.resource_class,
        r.hour_utc,
        'Usage' as charge_category,
        r.billed_seconds,
        {{ nano_to_money('r.gpu_hours_nano') }} as consumed_gpu_hours,
        {{ cost_components_from_nano('r') }},
        cast(0 as decimal(38, 9)) as sla_credit,
        {{ nano_to_money('r.billed_nano') }} as billed_cost
    from (
        -- integer sums (HUGEINT) of the exact nano-unit amounts, converted once per line
        select
            tenant_id, pool_id, resource_class, usage_hour as hour_utc,
            sum(billed_seconds) as billed_seconds,
            sum({{ rdiv('billed_seconds * gpu_fraction_e4 * 100000', '3600') }}) as gpu_hours_nano,
            sum(base_nano) as base_nano,
            sum(timed_nano) as timed_nano,
            sum(list_nano) as list_nano,
            sum(contracted_nano) as contracted_nano,
            sum(billed_nano) as billed_nano
        from {{ ref('int_rated_usage') }}
        where {{ usage_in_window('day') }}
        group by tenant_id, pool_id, resource_class, usage_hour
    ) as r
    left join (
        select pool_id, any_value(gpu_model) as gpu_model, any_value(zone) as zone
        from (
            select pool_id, gpu_model, zone from {{ source('warehouse', 'billing_rate_card_pools') }}
            union all
            select pool_id, gpu_model, zone from {{ ref('stg_price_book') }}
        )
        group by pool_id
    ) as p using (pool_id)
),

credit_lines as (
    select
        tenant_id,
        pool_id,
        gpu_model,
        zone,
        resource_class,
        charge_period_hour as hour_utc,
        'Credit' as charge_category,
        0 as billed_seconds,
        cast(0 as decimal(38, 9)) as consumed_gpu_hours,
        {{ each_cost_component('cast(0 as decimal(38, 9)) as {c}') }},
        cast(0 as decimal(38, 9)) as list_cost,
        sum(billed_cost) as sla_credit,
        sum(billed_cost) as billed_cost
    from {{ ref('fct_sla_credits') }}
    where {{ in_window('charge_period_hour', 'day') }}
    group by tenant_id, pool_id, gpu_model, zone, resource_class, charge_period_hour
),

lines as (
    select * from usage_lines
    union all
    select * from credit_lines
),

hourly as (
    select 'hour' as period_grain, hour_utc as period_start_utc, hour_utc + interval 1 hour as period_end_utc, *
        exclude (hour_utc)
    from lines
    where {{ in_window('hour_utc') }}
),

daily as (
    select
        'day' as period_grain,
        date_trunc('day', hour_utc) as period_start_utc,
        date_trunc('day', hour_utc) + interval 1 day as period_end_utc,
        tenant_id, pool_id, gpu_model, zone, resource_class, charge_category,
        sum(billed_seconds) as billed_seconds,
        sum(consumed_gpu_hours) as consumed_gpu_hours,
        {{ each_cost_component('sum({c}) as {c}') }},
        sum(list_cost) as list_cost,
        sum(sla_credit) as sla_credit,
        sum(billed_cost) as billed_cost
    from lines
    group by date_trunc('day', hour_utc), tenant_id, pool_id, gpu_model, zone, resource_class, charge_category
),

all_lines as (
    select * from hourly
    union all by name
    select * from daily
)

select
    {{ period_row_id('tenant_id', ['pool_id', 'resource_class', 'charge_category']) }} as invoice_line_id,
    {{ invoice_id('tenant_id', 'period_start_utc') }} as invoice_id,
    tenant_id,
    {{ period_columns() }},
    pool_id,
    gpu_model,
    zone,
    resource_class,
    charge_category,
    cast(billed_seconds as bigint) as billed_seconds,
    cast(consumed_gpu_hours as decimal(38, 9)) as consumed_gpu_hours,
    {{ each_cost_component('cast({c} as decimal(38, 9)) as {c}') }},
    cast(list_cost as decimal(38, 9)) as list_cost,
    cast(sla_credit as decimal(38, 9)) as sla_credit,
    cast(billed_cost as decimal(38, 9)) as billed_cost,
    (select currency from {{ ref('stg_billing_terms') }}) as currency
from all_lines
