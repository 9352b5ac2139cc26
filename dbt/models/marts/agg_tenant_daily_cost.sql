-- Each tenant's daily cost and why: base (list price x GPU-hours), the time-of-day/week
-- premium, the location premium, the drainability and commitment discounts, SLA credits.
-- base + time_premium + location_premium + drainability_discount + commitment_discount
--   = usage_cost;  usage_cost + sla_credits = billed_cost.
-- A full rebuild: it reads only the (small) daily invoice lines.
select
    tenant_id,
    cast(period_start_utc as date) as day,
    sum(consumed_gpu_hours) as gpu_hours,
    sum(billed_seconds) as billed_seconds,
    {{ each_cost_component('sum({c}) as {c}') }},
    sum(case when charge_category = 'Usage' then billed_cost else 0 end) as usage_cost,
    sum(sla_credit) as sla_credits,
    sum(billed_cost) as billed_cost,
    max(currency) as currency
from {{ ref('fct_invoice_lines') }}
where period_grain = 'day'
group by tenant_id, cast(period_start_utc as date)
