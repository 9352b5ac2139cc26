{#- Rated rows, one per usage interval and price segment, from a relation with the columns
    of int_usage_billed (`usage`: a ref or a parenthesised subquery) and the rating factors
    stored when its hours were rated: int_rated_segments (prices and time/location
    coefficients per pool, zone, class, hour and price segment) and int_commitment_tiers
    (per tenant and hour). The amounts are pure integer functions of those stored factors
    and the (immutable) usage interval, so computing them on read is as exact and as
    stable as storing them -- a later rate-card or price-book change never re-rates an hour
    that was rated; only re-rating its window does. Not storing a wide row per interval is
    what keeps the rollup within reach of a single hand-written query (see bench.py).
      billed = base x time x location x (1 - drainability) x (1 - commitment)
    base is the list (guaranteed) price x GPU-hours; the drainability discount is the gap
    to the drainable class price. Each step rounds half-up to a nano-unit (1e-9), and the
    components are differences of successive steps, so they add up to billed exactly. -#}
{% macro rated_rows(usage) -%}
select
    *,
    {{ scale_nano('timed_nano', 'location_coefficient_e6') }} as list_nano,
    {{ scale_nano('contracted_nano', '1000000 - commitment_discount_e6') }} as billed_nano
from (
    select
        *,
        {{ scale_nano('base_nano', 'time_coefficient_e6') }} as timed_nano,
        {{ scale_nano(scale_nano('class_base_nano', 'time_coefficient_e6'), 'location_coefficient_e6') }} as contracted_nano
    from (
        select
            *,
            {{ hourly_amount_nano('billed_seconds * gpu_fraction_e4', 'list_price_e6') }} as base_nano,
            {{ hourly_amount_nano('billed_seconds * gpu_fraction_e4', 'class_price_e6') }} as class_base_nano
        from (
            select
                *,
                date_diff('second', rated_start_utc, rated_end_utc) as billed_seconds
            from (
                select
                    u.interval_id, u.task_id, u.tenant_id, u.pool_id, u.gpu_model, u.zone,
                    u.resource_class, u.node_id, u.gpu_uuid, u.gpu_fraction, u.gpu_fraction_e4,
                    u.mig_profile, u.mem_mib, u.end_reason, u.platform_fault, u.drain_signal_at,
                    u.partition_key, u.metered_seconds, u.usage_hour, u.started_at,
                    s.seg_start as price_segment_start,
                    greatest(u.started_at_utc, coalesce(s.seg_start, u.started_at_utc)) as rated_start_utc,
                    greatest(
                        greatest(u.started_at_utc, coalesce(s.seg_start, u.started_at_utc)),
                        least(u.billed_end_utc, coalesce(s.seg_end, u.billed_end_utc))
                    ) as rated_end_utc,
                    s.list_price_e6,
                    s.class_price_e6,
                    s.time_coefficient_e6,
                    s.location_coefficient_e6,
                    t.commitment_discount_e6,
                    t.mtd_gpu_seconds_e4,
                    s.price_source,
                    s.solve_id,
                    s.time_band
                from {{ usage }} as u
                left join {{ ref('int_rated_segments') }} as s
                    on s.pool_id = u.pool_id
                    and s.zone = u.zone
                    and s.resource_class = u.resource_class
                    and s.usage_hour = u.usage_hour
                    and s.seg_end > u.started_at_utc
                    and s.seg_start < u.billed_probe_end_utc
                -- inner: only hours that were rated have a tier row per tenant with usage,
                -- so usage of hours not rated yet has no rated rows (as when they were stored)
                join {{ ref('int_commitment_tiers') }} as t
                    on t.tenant_id = u.tenant_id and t.usage_hour = u.usage_hour
            )
        )
    )
)
{%- endmacro %}
