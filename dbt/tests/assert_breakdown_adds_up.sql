-- Reconciliation: each rated row's components add up to its billed cost, exactly.
select interval_id, price_segment_start
from {{ ref('fct_rated_usage') }}
where base_cost + time_premium + location_premium + drainability_discount + commitment_discount
      <> billed_cost
