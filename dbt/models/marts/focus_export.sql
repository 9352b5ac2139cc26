{{ config(materialized='window_table',
          window_column='x_ChargeHourUtc', window_grain='hour') }}
-- FinOps FOCUS 1.2 export (meta focus_version; the column rules are dbt tests named
-- focus_1_2_<Column>_<rule>, tests/focus/ and _marts.yml): one row per tenant, hour, task
-- (ResourceId) and price point for usage, one per SLA credit. FOCUS columns first
-- (alphabetical), custom x_ columns after.
--   ListUnitPrice = list price x time x location coefficients (the guaranteed class's price);
--   ContractedUnitPrice adds the drainability discount (the drainable class's rate);
--   BilledCost = EffectiveCost adds the month-to-date volume tier discount (x_VolumeDiscount).
--   PricingCategory: "Dynamic" where the solver's price book set the price (it changes
--     every tick), "Standard" where the configured base price applied. Volume tiers are
--     Standard-style volume pricing, not commitment discounts: no row is "Committed" and the
--     CommitmentDiscount* columns stay null (no commitment discounts are sold yet).
--   SLA credits: ChargeCategory "Credit", List/Contracted/Effective cost = BilledCost, no
--     SKU, price or quantity.
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
        sum(commitment_discount) as volume_discount,
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
        'Usage' as charge_category,
        case when price_source like 'price_book%' then 'Dynamic' else 'Standard' end as pricing_category,
        task_id as resource_id,
        pool_id,
        gpu_model,
        zone,
        resource_class,
        'GPU time, ' || gpu_model || ' in ' || zone || ' (' || resource_class || ', ' || time_band || ')'
            as charge_description,
        'gpu:' || gpu_model || ':' || resource_class as sku_id,
        'gpu:' || gpu_model || ':' || resource_class || ':' || zone || ':' || time_band as sku_price_id,
        json_object('x_GpuModel', gpu_model, 'x_ResourceClass', resource_class, 'x_Zone', zone,
                    'x_TimeBand', time_band) as sku_price_details,
        cast(billed_cost as decimal(38, 9)) as billed_cost,
        cast(list_cost as decimal(38, 9)) as list_cost,
        cast(contracted_cost as decimal(38, 9)) as contracted_cost,
        cast(list_unit_price as decimal(38, 9)) as list_unit_price,
        cast(contracted_unit_price as decimal(38, 9)) as contracted_unit_price,
        cast(gpu_hours as decimal(38, 9)) as quantity,
        cast(billed_seconds as bigint) as x_BilledSeconds,
        cast(base_cost as decimal(38, 9)) as x_BaseCost,
        cast(time_premium as decimal(38, 9)) as x_TimePremium,
        cast(location_premium as decimal(38, 9)) as x_LocationPremium,
        cast(drainability_discount as decimal(38, 9)) as x_DrainabilityDiscount,
        cast(volume_discount as decimal(38, 9)) as x_VolumeDiscount,
        price_source as x_PriceSource,
        time_band as x_TimeBand,
        cast(list_price_per_gpu_hour as decimal(18, 6)) as x_ListPricePerGpuHour,
        cast(time_coefficient as decimal(18, 6)) as x_TimeCoefficient,
        cast(location_coefficient as decimal(18, 6)) as x_LocationCoefficient,
        cast(drainability_discount_rate as decimal(18, 6)) as x_DrainabilityDiscountRate,
        cast(commitment_discount_rate as decimal(18, 6)) as x_VolumeDiscountRate,
        cast(null as decimal(18, 6)) as x_SlaCreditRate,
        cast(null as decimal(38, 9)) as x_SlaAffectedCost,
        currency
    from usage_rows
),

credit_focus as (
    select
        'credit|' || credit_id as x_FocusRowId,
        charge_period_hour as x_ChargeHourUtc,
        tenant_id,
        'Credit' as charge_category,
        cast(null as varchar) as pricing_category,
        task_id as resource_id,
        pool_id,
        gpu_model,
        zone,
        resource_class,
        'SLA credit: platform-caused ' || end_reason || ' of task ' || task_id
            || ' (' || cast(sla_credit_rate as varchar) || ' of ' || cast(affected_cost as varchar) || ')'
            as charge_description,
        cast(null as varchar) as sku_id,
        cast(null as varchar) as sku_price_id,
        cast(null as json) as sku_price_details,
        cast(billed_cost as decimal(38, 9)) as billed_cost,
        cast(billed_cost as decimal(38, 9)) as list_cost,
        cast(billed_cost as decimal(38, 9)) as contracted_cost,
        cast(null as decimal(38, 9)) as list_unit_price,
        cast(null as decimal(38, 9)) as contracted_unit_price,
        cast(null as decimal(38, 9)) as quantity,
        cast(0 as bigint) as x_BilledSeconds,
        cast(0 as decimal(38, 9)) as x_BaseCost,
        cast(0 as decimal(38, 9)) as x_TimePremium,
        cast(0 as decimal(38, 9)) as x_LocationPremium,
        cast(0 as decimal(38, 9)) as x_DrainabilityDiscount,
        cast(0 as decimal(38, 9)) as x_VolumeDiscount,
        cast(null as varchar) as x_PriceSource,
        cast(null as varchar) as x_TimeBand,
        cast(null as decimal(18, 6)) as x_ListPricePerGpuHour,
        cast(null as decimal(18, 6)) as x_TimeCoefficient,
        cast(null as decimal(18, 6)) as x_LocationCoefficient,
        cast(null as decimal(18, 6)) as x_DrainabilityDiscountRate,
        cast(null as decimal(18, 6)) as x_VolumeDiscountRate,
        cast(sla_credit_rate as decimal(18, 6)) as x_SlaCreditRate,
        cast(affected_cost as decimal(38, 9)) as x_SlaAffectedCost,
        currency
    from {{ ref('fct_sla_credits') }}
    where {{ in_window('charge_period_hour') }}
),

rows as (
    select * from usage_focus
    union all by name
    select * from credit_focus
),

committed as (
    -- no commitment discounts are sold: every CommitmentDiscount* column is null, and a row
    -- is "Committed" only when it carries a commitment discount id (FOCUS PricingCategory)
    select
        *,
        cast(null as varchar) as commitment_discount_id
    from rows
)

select
    zone as "AvailabilityZone",
    billed_cost as "BilledCost",
    tenant_id as "BillingAccountId",
    tenant_id as "BillingAccountName",
    'Tenant' as "BillingAccountType",
    currency as "BillingCurrency",
    {{ utc_tz("date_trunc('month', x_ChargeHourUtc) + interval 1 month") }} as "BillingPeriodEnd",
    {{ utc_tz("date_trunc('month', x_ChargeHourUtc)") }} as "BillingPeriodStart",
    charge_category as "ChargeCategory",
    cast(null as varchar) as "ChargeClass",
    charge_description as "ChargeDescription",
    case when charge_category = 'Usage' then 'Usage-Based' else 'One-Time' end as "ChargeFrequency",
    {{ utc_tz("x_ChargeHourUtc + interval 1 hour") }} as "ChargePeriodEnd",
    {{ utc_tz("x_ChargeHourUtc") }} as "ChargePeriodStart",
    cast(null as varchar) as "CommitmentDiscountCategory",
    commitment_discount_id as "CommitmentDiscountId",
    cast(null as varchar) as "CommitmentDiscountName",
    cast(null as decimal(38, 9)) as "CommitmentDiscountQuantity",
    cast(null as varchar) as "CommitmentDiscountStatus",
    cast(null as varchar) as "CommitmentDiscountType",
    cast(null as varchar) as "CommitmentDiscountUnit",
    case when charge_category = 'Usage' then quantity end as "ConsumedQuantity",
    case when charge_category = 'Usage' then 'GPU-Hours' end as "ConsumedUnit",
    contracted_cost as "ContractedCost",
    contracted_unit_price as "ContractedUnitPrice",
    billed_cost as "EffectiveCost",
    {{ invoice_id('tenant_id', 'x_ChargeHourUtc') }} as "InvoiceId",
    'market-pipeline' as "InvoiceIssuerName",
    list_cost as "ListCost",
    list_unit_price as "ListUnitPrice",
    case when commitment_discount_id is not null then 'Committed' else pricing_category end as "PricingCategory",
    currency as "PricingCurrency",
    contracted_unit_price as "PricingCurrencyContractedUnitPrice",
    billed_cost as "PricingCurrencyEffectiveCost",
    list_unit_price as "PricingCurrencyListUnitPrice",
    quantity as "PricingQuantity",
    case when quantity is not null then 'GPU-Hours' end as "PricingUnit",
    'market-pipeline' as "ProviderName",
    'market-pipeline' as "PublisherName",
    zone as "RegionId",
    zone as "RegionName",
    resource_id as "ResourceId",
    cast(null as varchar) as "ResourceName",
    'GPU Task' as "ResourceType",
    'Compute' as "ServiceCategory",
    'GPU Compute' as "ServiceName",
    'Other (Compute)' as "ServiceSubcategory",
    sku_id as "SkuId",
    case when sku_id is not null then 'GPU Time' end as "SkuMeter",
    sku_price_details as "SkuPriceDetails",
    sku_price_id as "SkuPriceId",
    tenant_id as "SubAccountId",
    tenant_id as "SubAccountName",
    'Tenant' as "SubAccountType",
    json_object('market-pipeline/pool', pool_id, 'market-pipeline/gpu-model', gpu_model,
                'market-pipeline/resource-class', resource_class) as "Tags",
    x_FocusRowId,
    x_ChargeHourUtc,
    pool_id as x_PoolId,
    gpu_model as x_GpuModel,
    resource_class as x_ResourceClass,
    x_BilledSeconds,
    x_BaseCost,
    x_TimePremium,
    x_LocationPremium,
    x_DrainabilityDiscount,
    x_VolumeDiscount,
    x_VolumeDiscountRate,
    x_DrainabilityDiscountRate,
    x_ListPricePerGpuHour,
    x_TimeCoefficient,
    x_LocationCoefficient,
    x_TimeBand,
    x_PriceSource,
    x_SlaCreditRate,
    x_SlaAffectedCost
from committed
