-- The rate card's terms table must hold exactly one row (refreshed from the config).
select count(*) as terms_rows from {{ ref('stg_billing_terms') }} having count(*) <> 1
