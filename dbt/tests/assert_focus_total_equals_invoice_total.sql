{{ config(meta={'dagster': {'ref': {'name': 'focus_export'}}}) }}
-- Reconciliation: the FOCUS export and the hourly invoice lines agree per tenant and hour,
-- and so in total.
with focus as (
    select "BillingAccountId" as tenant_id, x_ChargeHourUtc as hour_utc, sum("BilledCost") as billed
    from {{ ref('focus_export') }}
    group by 1, 2
),
invoice as (
    select tenant_id, period_start_utc as hour_utc, sum(billed_cost) as billed
    from {{ ref('fct_invoice_lines') }}
    where period_grain = 'hour'
    group by 1, 2
)
select coalesce(f.tenant_id, i.tenant_id) as tenant_id, coalesce(f.hour_utc, i.hour_utc) as hour_utc,
       f.billed as focus_billed, i.billed as invoice_billed
from focus as f
full outer join invoice as i on f.tenant_id = i.tenant_id and f.hour_utc = i.hour_utc
where f.billed is distinct from i.billed
