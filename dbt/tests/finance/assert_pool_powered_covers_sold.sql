{{ config(meta={'dagster': {'ref': {'name': 'agg_pool_economics'}}}) }}
-- Every row: powered >= sold >= 0, idle = powered - sold, and powered is the observed
-- capacity unless billed use exceeded it (then exactly the sold hours).
select economics_row_id, observed_gpu_hours, powered_gpu_hours, sold_gpu_hours, idle_gpu_hours
from {{ ref('agg_pool_economics') }}
where powered_gpu_hours < sold_gpu_hours
   or sold_gpu_hours < 0
   or idle_gpu_hours <> powered_gpu_hours - sold_gpu_hours
   or sold_gpu_hours <> sold_guaranteed_gpu_hours + sold_drainable_gpu_hours
   or (period_grain = 'hour' and powered_gpu_hours <> greatest(observed_gpu_hours, sold_gpu_hours))
