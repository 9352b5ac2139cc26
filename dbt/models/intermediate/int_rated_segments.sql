{{ config(materialized='window_table',
          window_column='usage_hour', window_grain='hour') }}
-- The price factors of each rated hour, stored when the hour is rated: one row per pool,
-- zone, resource class, hour of the window with usage, and price segment in force during that hour, with
-- the list and class prices, the time coefficient of the hour and the location coefficient
-- of the zone (all x 1e6), and where the price came from. What was applied at rating time
-- stays here (with int_commitment_tiers), so later price-book or rate-card changes never
-- re-rate history; int_rated_usage (macro rated_rows) rates each usage interval against
-- these rows. Segments keep their full bounds (not clipped to the hour): a rated row's
-- price_segment_start is the segment's start. (Tenant is not in the key: it would multiply
-- the rows every usage row's join probes.)
-- The keys: every pool's zone (rate card and price book) and class, for each hour of the
-- window with usage (the commitment tiers' hours, which come from one scan of the usage).
-- Usage in a pool or zone outside both has no factors and fails the not-null and
-- every-interval-rated tests, as unpriceable usage should.
with usage_hours as (
    select distinct usage_hour
    from {{ ref('int_commitment_tiers') }}
    where {{ in_window('usage_hour') }}
),

pool_zones as (
    select pool_id, zone from {{ source('warehouse', 'billing_rate_card_pools') }}
    union
    select pool_id, zone from {{ ref('stg_price_book') }}
),

usage_keys as (
    select p.pool_id, p.zone, k.resource_class, h.usage_hour
    from pool_zones as p
    cross join (values ('guaranteed'), ('drainable')) as k(resource_class)
    cross join usage_hours as h
),

bounds as (
    select min(usage_hour) as lo, max(usage_hour) + interval 1 hour as hi from usage_keys
),

-- each price segment once per hour it overlaps, so keys find their segments by an
-- equi-join on (pool, class, hour) instead of a range join
segment_hours as (
    select
        s.pool_id, s.resource_class, s.seg_start, s.seg_end, s.list_price_e6, s.class_price_e6,
        s.price_source, s.solve_id,
        unnest(generate_series(date_trunc('hour', greatest(s.seg_start, b.lo)),
                               least(s.seg_end, b.hi) - interval 1 microsecond,
                               interval 1 hour)) as usage_hour
    from {{ ref('int_price_segments') }} as s
    cross join bounds as b
    where s.seg_end > b.lo and s.seg_start < b.hi
),

time_card as (
    select day_of_week, hour_of_day, band, {{ e6('coefficient') }} as t6
    from {{ source('warehouse', 'billing_rate_card_time') }}
),

zones as (
    select zone, {{ e6('location_coefficient') }} as l6
    from {{ source('warehouse', 'billing_rate_card_zones') }}
)

select
    k.usage_hour,
    k.pool_id,
    k.zone,
    k.resource_class,
    s.seg_start,
    s.seg_end,
    s.list_price_e6,
    s.class_price_e6,
    tc.t6 as time_coefficient_e6,
    z.l6 as location_coefficient_e6,
    tc.band as time_band,
    s.price_source,
    s.solve_id
from usage_keys as k
join segment_hours as s
    on s.pool_id = k.pool_id and s.resource_class = k.resource_class and s.usage_hour = k.usage_hour
left join time_card as tc
    on tc.day_of_week = isodow(k.usage_hour) and tc.hour_of_day = hour(k.usage_hour)
left join zones as z
    on z.zone = k.zone
