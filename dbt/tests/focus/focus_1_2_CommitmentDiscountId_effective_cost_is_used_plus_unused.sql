-- FOCUS 1.2 EffectiveCost, for each CommitmentDiscountId: "The sum of EffectiveCost where
-- ChargeCategory is Usage MUST equal the sum ... where CommitmentDiscountStatus is Used, plus
-- the sum ... where CommitmentDiscountStatus is Unused" and "MUST equal the sum of BilledCost
-- where ChargeCategory is Purchase". (No commitment discounts are sold yet: no ids.)
select "CommitmentDiscountId",
       sum(case when "ChargeCategory" = 'Usage' then "EffectiveCost" else 0 end) as usage_effective,
       sum(case when "ChargeCategory" = 'Usage' and "CommitmentDiscountStatus" in ('Used', 'Unused')
                then "EffectiveCost" else 0 end) as used_plus_unused,
       sum(case when "ChargeCategory" = 'Purchase' then "BilledCost" else 0 end) as purchased
from {{ ref('focus_export') }}
where "CommitmentDiscountId" is not null
group by 1
having usage_effective <> used_plus_unused or usage_effective <> purchased
