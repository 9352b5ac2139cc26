{#- Capacity (what the platform pays for powered GPUs) for agg_pool_economics. -#}

{#- The configured idle-cost allocation mode (dbt var `idle_cost_allocation`, from the
    config's [billing] idle_cost_allocation): fails the compile on anything else. -#}
{% macro idle_cost_allocation() -%}
{%- set mode = var('idle_cost_allocation') | string -%}
{%- if mode not in ['proportional', 'idle_line'] -%}
  {{ exceptions.raise_compiler_error("idle_cost_allocation=" ~ mode ~ " must be 'proportional' or 'idle_line'") }}
{%- endif -%}
{{ return(mode) }}
{%- endmacro %}

{#- A DECIMAL amount with 9 decimals as exact integer nano-units (HUGEINT), and back. -#}
{% macro money_to_nano(x) -%}
cast(({{ x }}) * 1000000000 as hugeint)
{%- endmacro %}

{% macro nano_to_money_wide(k) -%}
(cast({{ k }} as decimal(38, 0)) * 0.000000001::decimal(10, 9))
{%- endmacro %}

{#- round(amount x rate, 9) for a DECIMAL(38,9) amount and a DECIMAL(18,6) rate (half away
    from zero; DuckDB multiplies the decimals exactly, scale 15). -#}
{% macro money_times_rate(amount, rate) -%}
cast(round(({{ amount }}) * ({{ rate }}), 9) as decimal(38, 9))
{%- endmacro %}
