{{ config(materialized='view') }}
-- Rated usage, one row per usage interval and price segment: billed_seconds (after the
-- drain grace period), the prices and coefficients applied, and each price component in
-- DECIMAL. base + time_premium + location_premium + drainability_discount +
-- commitment_discount = billed_cost, exactly. The amounts are stored exact (integer
-- nano-units) in int_rated_usage; this view adds the usage interval's attributes.
select
    r.interval_id,
    r.price_segment_start,
    u.task_id,
    r.tenant_id,
    r.pool_id,
    u.gpu_model,
    u.zone,
    r.resource_class,
    u.node_id,
    u.gpu_uuid,
    u.gpu_fraction,
    u.mig_profile,
    u.mem_mib,
    u.end_reason,
    u.platform_fault,
    u.drain_signal_at,
    u.partition_key,
    r.usage_hour,
    {{ utc_tz("r.usage_hour") }} as charge_period_start,
    {{ utc_tz("r.usage_hour + interval 1 hour") }} as charge_period_end,
    {{ utc_tz("r.rated_start_utc") }} as rated_start,
    {{ utc_tz("r.rated_start_utc + to_seconds(r.billed_seconds)") }} as rated_end,
    r.rated_start_utc,
    r.rated_start_utc + to_seconds(r.billed_seconds) as rated_end_utc,
    u.metered_seconds,
    r.billed_seconds,
    {{ int_to_decimal('r.billed_seconds * r.gpu_fraction_e4', 4) }} as billed_gpu_seconds,
    {{ nano_to_money(rdiv('r.billed_seconds * r.gpu_fraction_e4 * 100000', '3600')) }} as consumed_gpu_hours,
    cast(u.mem_mib as bigint) * r.billed_seconds as billed_mem_mib_seconds,
    s.price_source,
    s.solve_id,
    tc.band as time_band,
    {{ int_to_decimal('r.list_price_e6', 6) }} as list_price_per_gpu_hour,
    {{ int_to_decimal('r.class_price_e6', 6) }} as class_price_per_gpu_hour,
    {{ int_to_decimal('r.time_coefficient_e6', 6) }} as time_coefficient,
    {{ int_to_decimal('r.location_coefficient_e6', 6) }} as location_coefficient,
    case when r.list_price_e6 > 0 then
        {{ int_to_decimal(rdiv('(r.list_price_e6 - r.class_price_e6) * 1000000', 'r.list_price_e6'), 6) }}
    end as drainability_discount_rate,
    {{ int_to_decimal('r.commitment_discount_e6', 6) }} as commitment_discount_rate,
    {{ int_to_decimal('r.mtd_gpu_seconds_e4', 4) }} as mtd_gpu_seconds_before,
    {{ nano_to_money(list_unit_nano('r')) }} as list_unit_price,
    {{ nano_to_money(contracted_unit_nano('r')) }} as contracted_unit_price,
    {{ nano_to_money(effective_unit_nano('r')) }} as effective_unit_price,
    {{ nano_to_money('r.base_nano') }} as base_cost,
    {{ nano_to_money('r.timed_nano - r.base_nano') }} as time_premium,
    {{ nano_to_money('r.list_nano - r.timed_nano') }} as location_premium,
    {{ nano_to_money('r.contracted_nano - r.list_nano') }} as drainability_discount,
    {{ nano_to_money('r.billed_nano - r.contracted_nano') }} as commitment_discount,
    {{ nano_to_money('r.list_nano') }} as list_cost,
    {{ nano_to_money('r.contracted_nano') }} as contracted_cost,
    {{ nano_to_money('r.billed_nano') }} as billed_cost,
    (select currency from {{ ref('stg_billing_terms') }}) as currency
from {{ ref('int_rated_usage') }} as r
left join {{ ref('stg_usage_intervals') }} as u using (interval_id)
left join {{ ref('int_price_segments') }} as s
    on s.pool_id = r.pool_id and s.resource_class = r.resource_class and s.seg_start = r.price_segment_start
left join {{ source('warehouse', 'billing_rate_card_time') }} as tc
    on tc.day_of_week = isodow(r.usage_hour) and tc.hour_of_day = hour(r.usage_hour)
