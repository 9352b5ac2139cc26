{#- The invoice a charge belongs to: one (provisional until the month closes) per tenant and
    UTC calendar month, the billing period. fct_invoice_lines and focus_export share it. -#}
{% macro invoice_id(tenant_id, period_start_utc) -%}
('INV-' || strftime(date_trunc('month', {{ period_start_utc }}), '%Y-%m') || '-' || {{ tenant_id }})
{%- endmacro %}
