{{ config(materialized='view') }}
-- Rated usage, one row per usage interval and price segment: billed_seconds (after the
-- drain grace period), the prices and coefficients applied, and each price component in
-- DECIMAL. base + time_premium + location_premium + drainability_discount +
-- commitment_discount = billed_cost, exactly. The exact integer amounts come from
-- int_rated_usage (rated against the factors stored when the hour was rated).
select
    r.interval_id,
    r.price_segment_start,
    r.task_id,
    r.tenant_id,
    r.pool_id,
    r.gpu_model,
    r.zone,
    r.resource_class,
    r.node_id,
    r.gpu_uuid,
    r.gpu_fraction,
    r.mig_profile,
    r.mem_mib,
    r.end_reason,
    r.platform_fault,
    r.drain_signal_at,
    r.partition_key,
    r.usage_hour,
    r.started_at,
    {{ utc_tz("r.usage_hour") }} as charge_period_start,
    {{ utc_tz("r.usage_hour + interval 1 hour") }} as charge_period_end,
    {{ utc_tz("r.rated_start_utc") }} as rated_start,
    {{ utc_tz("r.rated_start_utc + to_seconds(r.billed_seconds)") }} as rated_end,
    r.rated_start_utc,
    r.rated_start_utc + to_seconds(r.billed_seconds) as rated_end_utc,
    r.metered_seconds,
    r.billed_seconds,
    {{ int_to_decimal('r.billed_seconds * r.gpu_fraction_e4', 4) }} as billed_gpu_seconds,
    {{ nano_to_money(rdiv('r.billed_seconds * r.gpu_fraction_e4 * 100000', '3600')) }} as consumed_gpu_hours,
    cast(r.mem_mib as bigint) * r.billed_seconds as billed_mem_mib_seconds,
    r.price_source,
    r.solve_id,
    r.time_band,
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
    {{ cost_components_from_nano('r') }},
    {{ nano_to_money('r.contracted_nano') }} as contracted_cost,
    {{ nano_to_money('r.billed_nano') }} as billed_cost,
    (select currency from {{ ref('stg_billing_terms') }}) as currency
from {{ ref('int_rated_usage') }} as r
