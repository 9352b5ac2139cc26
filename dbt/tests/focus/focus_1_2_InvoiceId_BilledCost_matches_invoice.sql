{{ config(meta={'dagster': {'ref': {'name': 'focus_export'}}}) }}
-- FOCUS 1.2 BilledCost: "The sum of the BilledCost for a given InvoiceId MUST match the sum
-- of the payable amount provided in the corresponding invoice with the same id." The
-- invoice is the tenant's daily invoice lines of the month (fct_invoice_lines.invoice_id).
with focus as (
    select "InvoiceId" as invoice_id, "BillingAccountId" as tenant_id, sum("BilledCost") as billed
    from {{ ref('focus_export') }} group by 1, 2
),
invoice as (
    select invoice_id, tenant_id, sum(billed_cost) as billed
    from {{ ref('fct_invoice_lines') }} where period_grain = 'day' group by 1, 2
)
select coalesce(f.invoice_id, i.invoice_id) as invoice_id, f.billed as focus_billed, i.billed as invoice_billed
from focus as f full outer join invoice as i using (invoice_id, tenant_id)
where f.billed is distinct from i.billed
