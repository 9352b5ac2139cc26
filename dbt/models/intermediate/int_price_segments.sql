-- Piecewise-constant prices per pool and resource class. A segment starts at every price
-- change of the pool (either class) and holds the price in force then ("price at the time
-- of use"): the list price is the guaranteed price; the class price is the drainable price
-- for the drainable class. Before a pool's first published price the configured base price
-- applies, and a drainable class without its own price gets the configured minimum
-- drainable discount -- each marked in price_source.
with book as (
    select * from {{ ref('stg_price_book') }}
),

pools as (
    select pool_id, base_price_per_gpu_hour
    from {{ source('warehouse', 'billing_rate_card_pools') }}
),

terms as (
    select drainable_default_discount from {{ ref('stg_billing_terms') }}
),

pool_ids as (
    select pool_id from pools
    union
    select pool_id from book
),

breaks as (
    select pool_id, timestamp '1970-01-01' as seg_start from pool_ids
    union
    select pool_id, effective_from_utc from book
),

segments as (
    select
        pool_id,
        seg_start,
        coalesce(lead(seg_start) over (partition by pool_id order by seg_start),
                 timestamp '2200-01-01') as seg_end
    from breaks
),

guaranteed as (
    select pool_id, effective_from_utc, price_per_gpu_hour, solve_id
    from book where resource_class = 'guaranteed'
),

drainable as (
    select pool_id, effective_from_utc, price_per_gpu_hour, solve_id
    from book where resource_class = 'drainable'
),

with_guaranteed as (
    select s.*, g.price_per_gpu_hour as guaranteed_price, g.solve_id as guaranteed_solve_id
    from segments as s
    asof left join guaranteed as g
        on g.pool_id = s.pool_id and s.seg_start >= g.effective_from_utc
),

priced as (
    select w.*, d.price_per_gpu_hour as drainable_price, d.solve_id as drainable_solve_id
    from with_guaranteed as w
    asof left join drainable as d
        on d.pool_id = w.pool_id and w.seg_start >= d.effective_from_utc
),

listed as (
    select
        p.*,
        coalesce(p.guaranteed_price, c.base_price_per_gpu_hour) as list_price,
        case when p.guaranteed_price is null then 'config_base_price' else 'price_book' end
            as list_price_source
    from priced as p
    left join pools as c using (pool_id)
)

select
    pool_id,
    resource_class,
    seg_start,
    seg_end,
    list_price,
    class_price,
    {{ e6('list_price') }} as list_price_e6,
    {{ e6('class_price') }} as class_price_e6,
    price_source,
    solve_id
from (
select
    l.pool_id,
    k.resource_class,
    l.seg_start,
    l.seg_end,
    l.list_price,
    case
        when k.resource_class = 'guaranteed' then l.list_price
        else coalesce(
            l.drainable_price,
            cast(round(l.list_price * (1 - (select drainable_default_discount from terms)), 6)
                 as decimal(18, 6)))
    end as class_price,
    case
        when k.resource_class = 'drainable' and l.drainable_price is null
            then l.list_price_source || '+default_drainable_discount'
        else l.list_price_source
    end as price_source,
    case when k.resource_class = 'drainable' then l.drainable_solve_id
         else l.guaranteed_solve_id end as solve_id
from listed as l
cross join (values ('guaranteed'), ('drainable')) as k(resource_class)
)
