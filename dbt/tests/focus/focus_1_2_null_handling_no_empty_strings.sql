-- FOCUS 1.2 null handling: columns "MUST NOT use empty strings or placeholder values ... to
-- represent a null"; string handling: empty strings and strings of only spaces "SHOULD NOT
-- be used in not-nullable string columns". Checks every string column of focus_export.
{%- set relation = ref('focus_export') %}
{%- set columns = adapter.get_columns_in_relation(relation) if execute else [] %}
{%- set strings = [] %}
{%- for c in columns if c.is_string() %}{% do strings.append(c.name) %}{% endfor %}
{%- if strings %}
{%- for name in strings %}
select '{{ name }}' as column_name, count(*) as n_rows
from {{ relation }} where trim("{{ name }}") = ''
having count(*) > 0
{{ "union all" if not loop.last }}
{%- endfor %}
{%- else %}
select null as column_name, 0 as n_rows where false
{%- endif %}
