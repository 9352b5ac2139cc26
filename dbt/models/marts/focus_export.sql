{{ config(materialized='window_table',
          window_column='x_ChargeHourUtc', window_grain='hour') }}
-- FinOps FOCUS export: one row per tenant, hour, task (ResourceId) and price point for
-- usage, one per SLA credit. ListUnitPrice = list price x time x location coefficients;
-- ContractedUnitPrice adds the drainability discount (the drainable SKU's rate);
-- BilledCost = EffectiveCost adds the usage-based commitment discount (no amortised
-- prepayments). PricingCategory: Committed when a commitment discount applied, Dynamic for
-- the drainable (interruptible, spot-like) class, Standard otherwise.
with usage_rows as (
    select
        tenant_id,
        usage_hour,
        task_id,
        pool_id,
        gpu_model,
        zone,
        resource_class,
        time_band,
        time_coefficient,
        location_coefficient,
        drainability_discount_rate,
        commitment_discount_rate,
        list_price_per_gpu_hour,
        price_source,
        list_unit_price,
        contracted_unit_price,
        effective_unit_price,
        currency,
        sum(consumed_gpu_hours) as gpu_hours,
        sum(billed_seconds) as billed_seconds,
        sum(base_cost) as base_cost,
        sum(time_premium) as time_premium,
        sum(location_premium) as location_premium,
        sum(drainability_discount) as drainability_discount,
        sum(commitment_discount) as commitment_discount,
        sum(base_cost + time_premium + location_premium) as list_cost,
        sum(base_cost + time_premium + location_premium + drainability_discount) as contracted_cost,
        sum(billed_cost) as billed_cost
    from {{ ref('fct_rated_usage') }}
    where {{ usage_in_window() }}
    group by all
),

usage_focus as (
    select
        'usage|' || tenant_id || '|' || strftime(usage_hour, '%Y-%m-%dT%H') || '|' || task_id || '|'
            || pool_id || '|' || resource_class || '|' || cast(list_unit_price as varchar) || '|'
            || cast(effective_unit_price as varchar) as x_FocusRowId,
        usage_hour as x_ChargeHourUtc,
        tenant_id,
        'Usage' as "ChargeCategory",
        case
            when commitment_discount_rate > 0 then 'Committed'
            when resource_class = 'drainable' then 'Dynamic'
            else 'Standard'
        end as "PricingCategory",
        task_id as "ResourceId",
        'gpu-task' as "ResourceType",
        pool_id,
        gpu_model,
        zone,
        resource_class,
        'GPU time, ' || gpu_model || ' in ' || zone || ' (' || resource_class || ', ' || time_band || ')'
            as "ChargeDescription",
        cast(billed_cost as decimal(38, 9)) as "BilledCost",
        cast(billed_cost as decimal(38, 9)) as "EffectiveCost",
        cast(list_cost as decimal(38, 9)) as "ListCost",
        cast(contracted_cost as decimal(38, 9)) as "ContractedCost",
        list_unit_price as "ListUnitPrice",
        contracted_unit_price as "ContractedUnitPrice",
        cast(gpu_hours as decimal(38, 9)) as "ConsumedQuantity",
        cast(gpu_hours as decimal(38, 9)) as "PricingQuantity",
        json_object(
            'gpu_model', gpu_model, 'zone', zone, 'resource_class', resource_class,
            'list_price_per_gpu_hour', list_price_per_gpu_hour, 'price_source', price_source,
            'time_band', time_band, 'time_coefficient', time_coefficient,
            'location_coefficient', location_coefficient,
            'drainability_discount_rate', drainability_discount_rate,
            'commitment_discount_rate', commitment_discount_rate,
            'effective_unit_price', effective_unit_price) as "SkuPriceDetails",
        cast(billed_seconds as bigint) as x_BilledSeconds,
        cast(base_cost as decimal(38, 9)) as x_BaseCost,
        cast(time_premium as decimal(38, 9)) as x_TimePremium,
        cast(location_premium as decimal(38, 9)) as x_LocationPremium,
        cast(drainability_discount as decimal(38, 9)) as x_DrainabilityDiscount,
        cast(commitment_discount as decimal(38, 9)) as x_CommitmentDiscount,
        currency
    from usage_rows
),

credit_focus as (
    select
        'credit|' || credit_id as x_FocusRowId,
        charge_period_hour as x_ChargeHourUtc,
        tenant_id,
        'Credit' as "ChargeCategory",
        'Standard' as "PricingCategory",
        task_id as "ResourceId",
        'gpu-task' as "ResourceType",
        pool_id,
        gpu_model,
        zone,
        resource_class,
        'SLA credit: platform-caused ' || end_reason || ' of task ' || task_id
            || ' (' || cast(sla_credit_rate as varchar) || ' of ' || cast(affected_cost as varchar) || ')'
            as "ChargeDescription",
        billed_cost as "BilledCost",
        billed_cost as "EffectiveCost",
        cast(0 as decimal(38, 9)) as "ListCost",
        cast(0 as decimal(38, 9)) as "ContractedCost",
        cast(null as decimal(38, 9)) as "ListUnitPrice",
        cast(null as decimal(38, 9)) as "ContractedUnitPrice",
        cast(null as decimal(38, 9)) as "ConsumedQuantity",
        cast(null as decimal(38, 9)) as "PricingQuantity",
        json_object('sla_credit_rate', sla_credit_rate, 'affected_cost', affected_cost,
                    'credited_seconds', credited_seconds, 'fault_at', fault_at) as "SkuPriceDetails",
        cast(0 as bigint) as x_BilledSeconds,
        cast(0 as decimal(38, 9)) as x_BaseCost,
        cast(0 as decimal(38, 9)) as x_TimePremium,
        cast(0 as decimal(38, 9)) as x_LocationPremium,
        cast(0 as decimal(38, 9)) as x_DrainabilityDiscount,
        cast(0 as decimal(38, 9)) as x_CommitmentDiscount,
        currency
    from {{ ref('fct_sla_credits') }}
    where {{ in_window('charge_period_hour') }}
),

rows as (
    select * from usage_focus
    union all by name
    select * from credit_focus
)

select
    x_FocusRowId,
    x_ChargeHourUtc,
    tenant_id as "BillingAccountId",
    tenant_id as "BillingAccountName",
    tenant_id as "SubAccountId",
    {{ utc_tz("date_trunc('month', x_ChargeHourUtc)") }} as "BillingPeriodStart",
    {{ utc_tz("date_trunc('month', x_ChargeHourUtc) + interval 1 month") }} as "BillingPeriodEnd",
    {{ utc_tz("x_ChargeHourUtc") }} as "ChargePeriodStart",
    {{ utc_tz("x_ChargeHourUtc + interval 1 hour") }} as "ChargePeriodEnd",
    "ChargeCategory",
    cast(null as varchar) as "ChargeClass",
    "ChargeDescription",
    case when "ChargeCategory" = 'Usage' then 'Usage-Based' else 'One-Time' end as "ChargeFrequency",
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "ListUnitPrice",
    "ContractedUnitPrice",
    "ConsumedQuantity",
    case when "ChargeCategory" = 'Usage' then 'GPU-Hours' end as "ConsumedUnit",
    "PricingQuantity",
    case when "ChargeCategory" = 'Usage' then 'GPU-Hours' end as "PricingUnit",
    "PricingCategory",
    'gpu:' || gpu_model || ':' || zone || ':' || resource_class as "SkuId",
    'gpu:' || gpu_model || ':' || zone || ':' || resource_class || ':' || pool_id as "SkuPriceId",
    "SkuPriceDetails",
    "ResourceId",
    "ResourceId" as "ResourceName",
    "ResourceType",
    zone as "RegionId",
    zone as "RegionName",
    zone as "AvailabilityZone",
    'GPU Compute' as "ServiceName",
    'Compute' as "ServiceCategory",
    'market-pipeline' as "ProviderName",
    'market-pipeline' as "PublisherName",
    'market-pipeline' as "InvoiceIssuerName",
    currency as "BillingCurrency",
    json_object('tenant_id', tenant_id, 'task_id', "ResourceId", 'pool_id', pool_id,
                'gpu_model', gpu_model, 'resource_class', resource_class) as "Tags",
    x_BilledSeconds,
    x_BaseCost,
    x_TimePremium,
    x_LocationPremium,
    x_DrainabilityDiscount,
    x_CommitmentDiscount
from rows
