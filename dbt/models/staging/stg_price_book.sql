-- Published prices with naive-UTC effective times.
select
    pool_id,
    gpu_model,
    zone,
    resource_class,
    effective_from,
    {{ utc_naive('effective_from') }} as effective_from_utc,
    price_per_gpu_hour,
    solve_id,
    source
from {{ source('warehouse', 'price_book') }}
