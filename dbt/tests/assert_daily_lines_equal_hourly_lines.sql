{{ config(meta={'dagster': {'ref': {'name': 'fct_invoice_lines'}}}) }}
-- Reconciliation: each daily invoice line equals the sum of its day's hourly lines.
with hourly as (
    select invoice_key, sum(billed_cost) as billed from (
        select tenant_id || '|' || pool_id || '|' || resource_class || '|' || charge_category
                   || '|' || strftime(date_trunc('day', period_start_utc), '%Y-%m-%d') as invoice_key,
               billed_cost
        from {{ ref('fct_invoice_lines') }} where period_grain = 'hour')
    group by 1
),
daily as (
    select tenant_id || '|' || pool_id || '|' || resource_class || '|' || charge_category
               || '|' || strftime(period_start_utc, '%Y-%m-%d') as invoice_key,
           billed_cost as billed
    from {{ ref('fct_invoice_lines') }} where period_grain = 'day'
)
select coalesce(h.invoice_key, d.invoice_key) as invoice_key, h.billed as hourly, d.billed as daily
from hourly as h full outer join daily as d on h.invoice_key = d.invoice_key
where h.billed is distinct from d.billed
