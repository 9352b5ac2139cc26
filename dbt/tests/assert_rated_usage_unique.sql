-- Rated usage has one row per usage interval and price segment.
select interval_id, price_segment_start, count(*) as n
from {{ ref('fct_rated_usage') }}
group by interval_id, price_segment_start
having count(*) > 1
