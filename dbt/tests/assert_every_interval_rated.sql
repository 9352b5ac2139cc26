{{ config(meta={"dagster": {"ref": {"name": "fct_rated_usage"}}}) }}
-- Reconciliation: every usage interval of the billing window has rated rows, and no
-- seconds are billed beyond its billing cut-off (end, or drain signal + grace).
with expected as (
    select interval_id, billable_seconds
    from {{ ref('int_usage_billed') }}
    where {{ in_window('usage_hour') }}
),
rated as (
    select interval_id, sum(billed_seconds) as billed_seconds
    from {{ ref('fct_rated_usage') }}
    where {{ in_window('usage_hour') }}
    group by interval_id
)
select e.interval_id, e.billable_seconds, r.billed_seconds
from expected as e
left join rated as r using (interval_id)
where r.billed_seconds is null or r.billed_seconds <> e.billable_seconds
