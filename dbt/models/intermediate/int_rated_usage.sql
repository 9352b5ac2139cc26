{{ config(materialized='incremental', incremental_strategy='window_replace',
          window_column='usage_hour', window_grain='hour') }}
-- Rating, stored narrow and exact: one row per usage interval and price segment, amounts in
-- integer nano-units of the currency (1e-9), prices and coefficients x 1e6 -- what was
-- applied at rating time, so later rate-card changes never re-rate history.
--   billed = base x time x location x (1 - drainability) x (1 - commitment)
-- base is the list (guaranteed) price x GPU-hours; the drainability discount is the gap to
-- the drainable class price. Each step rounds half-up to a nano-unit, and the components
-- are differences of successive steps, so they add up to the billed amount exactly.
-- fct_rated_usage (a view) shows these rows in DECIMAL with their descriptive columns (the
-- price segment's source and solve, the time band) joined back, and the unit prices
-- (macros list_unit_nano, contracted_unit_nano, effective_unit_nano).
with usage as materialized (
    select
        interval_id, tenant_id, pool_id, zone, resource_class, gpu_fraction_e4, usage_hour,
        started_at_utc, billed_end_utc, billed_probe_end_utc
    from {{ ref('int_usage_billed') }}
    where {{ in_window('usage_hour') }}
),

-- Price segments cut into the window's hours that have usage, so that usage joins its
-- segments on (pool, class, hour) -- an equi-join -- instead of a range join.
bounds as (
    select min(usage_hour) as lo, max(usage_hour) + interval 1 hour as hi from usage
),

segments as (
    select
        s.pool_id, s.resource_class, s.seg_start, s.seg_end, s.list_price_e6, s.class_price_e6,
        unnest(generate_series(date_trunc('hour', greatest(s.seg_start, b.lo)),
                               least(s.seg_end, b.hi) - interval 1 microsecond,
                               interval 1 hour)) as usage_hour
    from {{ ref('int_price_segments') }} as s
    cross join bounds as b
    where s.seg_end > b.lo and s.seg_start < b.hi
),

time_card as (
    select day_of_week, hour_of_day, {{ e6('coefficient') }} as t6
    from {{ source('warehouse', 'billing_rate_card_time') }}
),

zones as (
    select zone, {{ e6('location_coefficient') }} as l6
    from {{ source('warehouse', 'billing_rate_card_zones') }}
),

tiers as (
    select *, {{ e6('commitment_discount_rate') }} as d6 from {{ ref('int_commitment_tiers') }}
),

priced as (
    select
        u.*,
        s.seg_start,
        s.list_price_e6,
        s.class_price_e6,
        greatest(u.started_at_utc, coalesce(s.seg_start, u.started_at_utc)) as rated_start_utc,
        greatest(
            greatest(u.started_at_utc, coalesce(s.seg_start, u.started_at_utc)),
            least(u.billed_end_utc, coalesce(s.seg_end, u.billed_end_utc))
        ) as rated_end_utc
    from usage as u
    left join segments as s
        on s.pool_id = u.pool_id
        and s.resource_class = u.resource_class
        and s.usage_hour = u.usage_hour
        and s.seg_end > u.started_at_utc
        and s.seg_start < u.billed_probe_end_utc
),

quantities as (
    select
        p.*,
        date_diff('second', p.rated_start_utc, p.rated_end_utc) as billed_seconds,
        date_diff('second', p.rated_start_utc, p.rated_end_utc) * p.gpu_fraction_e4 as gs4,
        ct.mtd_gpu_seconds_e4,
        tc.t6,
        z.l6,
        ct.d6
    from priced as p
    left join time_card as tc
        on tc.day_of_week = isodow(p.usage_hour) and tc.hour_of_day = hour(p.usage_hour)
    left join zones as z
        on z.zone = p.zone
    left join tiers as ct
        on ct.tenant_id = p.tenant_id and ct.usage_hour = p.usage_hour
),

chain as (
    select
        q.*,
        {{ hourly_amount_nano('q.gs4', 'q.list_price_e6') }} as c0,
        {{ hourly_amount_nano('q.gs4', 'q.class_price_e6') }} as d0
    from quantities as q
),

chain1 as (
    select *,
        {{ scale_nano('c0', 't6') }} as c1,
        {{ scale_nano(scale_nano('d0', 't6'), 'l6') }} as c3
    from chain
),

chain2 as (
    select *,
        {{ scale_nano('c1', 'l6') }} as c2,
        {{ scale_nano('c3', '1000000 - d6') }} as c4
    from chain1
)

select
    interval_id,
    seg_start as price_segment_start,
    usage_hour,
    tenant_id,
    pool_id,
    resource_class,
    gpu_fraction_e4,
    rated_start_utc,
    billed_seconds,
    list_price_e6,
    class_price_e6,
    t6 as time_coefficient_e6,
    l6 as location_coefficient_e6,
    d6 as commitment_discount_e6,
    mtd_gpu_seconds_e4,
    c0 as base_nano,
    c1 as timed_nano,
    c2 as list_nano,
    c3 as contracted_nano,
    c4 as billed_nano
from chain2
