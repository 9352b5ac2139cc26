-- Daily revenue per pool and resource class: GPU-hours sold, list value, billed usage,
-- SLA credits, net revenue and the effective price per GPU-hour. Full rebuild over the
-- small daily invoice lines.
with daily as (
    select
        cast(period_start_utc as date) as day,
        pool_id,
        gpu_model,
        zone,
        resource_class,
        sum(consumed_gpu_hours) as gpu_hours,
        sum(list_cost) as list_cost,
        sum(case when charge_category = 'Usage' then billed_cost else 0 end) as usage_revenue,
        sum(sla_credit) as sla_credits,
        sum(billed_cost) as net_revenue,
        count(distinct tenant_id) as tenants,
        max(currency) as currency
    from {{ ref('fct_invoice_lines') }}
    where period_grain = 'day'
    group by cast(period_start_utc as date), pool_id, gpu_model, zone, resource_class
)

select
    *,
    {{ decimal_ratio('net_revenue', 'gpu_hours') }} as effective_price_per_gpu_hour
from daily
