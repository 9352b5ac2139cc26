select
    currency,
    grace_seconds,
    sla_credit_rate,
    sla_credit_window_seconds,
    drainable_default_discount,
    refreshed_at
from {{ source('warehouse', 'billing_terms') }}
