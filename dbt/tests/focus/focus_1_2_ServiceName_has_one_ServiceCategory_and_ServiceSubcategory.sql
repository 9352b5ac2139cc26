-- FOCUS 1.2 ServiceName: "MUST have one and only one ServiceCategory"; "SHOULD have one and
-- only one ServiceSubcategory".
select "ServiceName", count(distinct "ServiceCategory") as categories,
       count(distinct "ServiceSubcategory") as subcategories
from {{ ref('focus_export') }}
group by 1
having count(distinct "ServiceCategory") <> 1 or count(distinct "ServiceSubcategory") > 1
