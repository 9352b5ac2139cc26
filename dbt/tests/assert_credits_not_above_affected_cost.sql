-- An SLA credit never exceeds the cost it compensates, nor goes negative.
select credit_id from {{ ref('fct_sla_credits') }}
where credit_amount < 0 or credit_amount > affected_cost
