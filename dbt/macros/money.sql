{#- Money stays exact end to end, never floating point. Row-level rating runs in BIGINT
    fixed point (prices and coefficients x 1e6, GPU-seconds x 1e4, amounts in nano-units
    of the currency, 1e-9) with half-up rounding, because DuckDB turns DECIMAL / DECIMAL
    into DOUBLE and its HUGEINT division is ~50x slower than BIGINT. Stored amounts are
    DECIMAL(18,9) (rows) and DECIMAL(38,9) (sums). Overflow is loud (an error): it needs a
    single row's price x coefficients above ~4,600 per GPU-hour. -#}

{#- round_half_up(a / b) for integers a >= 0, b > 0. -#}
{% macro rdiv(a, b) -%}
((2 * ({{ a }}) + ({{ b }})) // (2 * ({{ b }})))
{%- endmacro %}

{#- A DECIMAL with 6 decimals (price, coefficient, rate) as a BIGINT x 1e6 (exact). -#}
{% macro e6(x) -%}
cast(({{ x }}) * 1000000 as bigint)
{%- endmacro %}

{#- An integer count of 10^-scale units as DECIMAL(18, scale) (exact, no HUGEINT). -#}
{% macro int_to_decimal(k, scale=9) -%}
{%- set unit = 10 ** scale -%}
{%- set tick = '0.' ~ ('0' * (scale - 1)) ~ '1' -%}
(cast(({{ k }}) // {{ unit }} as decimal(18, {{ scale }}))
 + cast(({{ k }}) % {{ unit }} as decimal({{ scale }}, 0)) * {{ tick }}::decimal({{ scale }}, {{ scale }}))
{%- endmacro %}

{#- Nano-units (BIGINT) -> currency, DECIMAL(18,9). -#}
{% macro nano_to_money(k) -%}
{{ int_to_decimal(k, 9) }}
{%- endmacro %}

{#- GPU-seconds x 1e4 and a price per GPU-hour x 1e6 -> amount in nano-units:
    round(gpu_seconds x price / 3600, 9) = round(gs4 x p6 / 36000) nano. -#}
{% macro hourly_amount_nano(gpu_seconds_e4, price_e6) -%}
{{ rdiv('(' ~ gpu_seconds_e4 ~ ') * (' ~ price_e6 ~ ')', '36000') }}
{%- endmacro %}

{#- An amount in nano-units times a factor x 1e6, rounded back to nano-units. -#}
{% macro scale_nano(nano, factor_e6) -%}
{{ rdiv('(' ~ nano ~ ') * (' ~ factor_e6 ~ ')', '1000000') }}
{%- endmacro %}

{#- round(numerator / denominator, 6) as DECIMAL(38,6) via HUGEINT: for small tables only
    (per-day aggregates), NULL when the denominator is 0. -#}
{% macro decimal_ratio(numerator, denominator) -%}
(case when {{ denominator }} = 0 then null else
  cast((cast(cast({{ numerator }} as decimal(38, 10)) * 10000000000::hugeint as hugeint) * 2000000
        + cast(cast({{ denominator }} as decimal(38, 10)) * 10000000000::hugeint as hugeint))
       // (2 * cast(cast({{ denominator }} as decimal(38, 10)) * 10000000000::hugeint as hugeint))
  as decimal(38, 0)) * 0.000001::decimal(18, 6) end)
{%- endmacro %}

{#- Unit prices per GPU-hour in nano-units from a rated row (alias `r`): list x time x
    location, the class price likewise (contracted), then less the commitment discount. -#}
{% macro list_unit_nano(r) -%}
{{ scale_nano(scale_nano(r ~ '.list_price_e6 * 1000', r ~ '.time_coefficient_e6'), r ~ '.location_coefficient_e6') }}
{%- endmacro %}

{% macro contracted_unit_nano(r) -%}
{{ scale_nano(scale_nano(r ~ '.class_price_e6 * 1000', r ~ '.time_coefficient_e6'), r ~ '.location_coefficient_e6') }}
{%- endmacro %}

{% macro effective_unit_nano(r) -%}
{{ scale_nano(contracted_unit_nano(r), '1000000 - ' ~ r ~ '.commitment_discount_e6') }}
{%- endmacro %}
