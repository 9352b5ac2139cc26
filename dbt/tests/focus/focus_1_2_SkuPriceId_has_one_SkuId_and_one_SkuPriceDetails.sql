-- FOCUS 1.2 SkuPriceId: "MUST have one and only one parent SkuId". SkuPriceDetails: "MUST be
-- associated with a given SkuPriceId" (the same details for every row of that price).
-- SkuMeter: "SHOULD remain consistent over time for a given SkuId".
select 'SkuPriceId ' || "SkuPriceId" as what, count(distinct "SkuId") as n
from {{ ref('focus_export') }} where "SkuPriceId" is not null group by "SkuPriceId"
having count(distinct "SkuId") <> 1 or count(distinct cast("SkuPriceDetails" as varchar)) <> 1
union all
select 'SkuId ' || "SkuId", count(distinct "SkuMeter")
from {{ ref('focus_export') }} where "SkuId" is not null group by "SkuId"
having count(distinct "SkuMeter") > 1
