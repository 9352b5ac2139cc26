{{ config(materialized='view') }}
-- Rating, exact: one row per usage interval and price segment, amounts in integer
-- nano-units of the currency (1e-9), prices and coefficients x 1e6. A view: the amounts
-- are computed from the usage interval and the rating factors stored when its hour was
-- rated (int_rated_segments, int_commitment_tiers) -- see macro rated_rows. fct_rated_usage
-- shows these rows in DECIMAL; fct_invoice_lines sums them.
{{ rated_rows(ref('int_usage_billed')) }}
