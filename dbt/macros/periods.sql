{#- The period columns every rolled-up mart carries, in this order: its grain, the period as
    UTC timestamptz (start, end) and the naive UTC start it is keyed and windowed on. -#}
{% macro period_columns(start='period_start_utc', end='period_end_utc') -%}
    period_grain,
    {{ utc_tz(start) }} as period_start,
    {{ utc_tz(end) }} as period_end,
    {{ start }}
{%- endmacro %}

{#- A rolled-up row's id: its leading key, the grain and the period start, then any further
    keys, joined with '|'. -#}
{% macro period_row_id(first, rest=[], start='period_start_utc') -%}
    {{ first }} || '|' || period_grain || '|' || strftime({{ start }}, '%Y-%m-%dT%H:%M:%S')
    {%- for key in rest %} || '|' || {{ key }}{% endfor %}
{%- endmacro %}
