-- FOCUS 1.2 ServiceSubcategory: "MUST be one of the allowed values" and "MUST have one and
-- only one parent ServiceCategory as specified in the allowed values".
select "ServiceCategory", "ServiceSubcategory", count(*) as n_rows
from {{ ref('focus_export') }} as f
where not exists (
    select 1 from {{ focus_service_subcategories() }}
    where allowed.service_category = f."ServiceCategory" and allowed.service_subcategory = f."ServiceSubcategory")
group by 1, 2
