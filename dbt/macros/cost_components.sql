{#- The five components of a cost, in the order they add up:
    base + time_premium + location_premium + drainability_discount + commitment_discount
    = billed cost. One list, so that every mart carries the same columns in the same order. -#}
{% macro cost_component_names() -%}
{{ return(['base_cost', 'time_premium', 'location_premium', 'drainability_discount', 'commitment_discount']) }}
{%- endmacro %}

{#- One select column per component: `template` with {c} standing for its name, e.g.
    each_cost_component('sum({c}) as {c}'). Comma-separated, no trailing comma. -#}
{% macro each_cost_component(template) -%}
{%- for c in cost_component_names() -%}
{{ template | replace('{c}', c) }}{{ ",\n    " if not loop.last }}
{%- endfor -%}
{%- endmacro %}

{#- The components and the list cost from rated usage's exact nano-unit amounts (alias r):
    each component is the step between two cumulative amounts (base, timed, list,
    contracted, billed), so they add up to the billed cost to the nano-unit. -#}
{% macro cost_components_from_nano(r='r') -%}
{{ nano_to_money(r ~ '.base_nano') }} as base_cost,
    {{ nano_to_money(r ~ '.timed_nano - ' ~ r ~ '.base_nano') }} as time_premium,
    {{ nano_to_money(r ~ '.list_nano - ' ~ r ~ '.timed_nano') }} as location_premium,
    {{ nano_to_money(r ~ '.contracted_nano - ' ~ r ~ '.list_nano') }} as drainability_discount,
    {{ nano_to_money(r ~ '.billed_nano - ' ~ r ~ '.contracted_nano') }} as commitment_discount,
    {{ nano_to_money(r ~ '.list_nano') }} as list_cost
{%- endmacro %}
