-- Reconciliation: no interval is billed for more seconds than were metered.
select interval_id, max(metered_seconds) as metered_seconds, sum(billed_seconds) as billed_seconds
from {{ ref('fct_rated_usage') }}
group by interval_id
having sum(billed_seconds) > max(metered_seconds) or sum(billed_seconds) < 0
