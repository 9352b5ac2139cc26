-- FOCUS 1.2 column handling: every Mandatory column "MUST be present"; custom columns "MUST
-- be prefixed with a consistent x_ prefix" and "SHOULD be listed after all FOCUS columns".
-- depends_on: {{ ref('focus_export') }}
{%- set focus = focus_columns() %}
with columns as (
    select column_name, ordinal_position
    from information_schema.columns
    where table_name = 'focus_export' and table_schema = 'main'
),
focus_positions as (
    select max(ordinal_position) as last_focus from columns
    where column_name in ('{{ focus | join("', '") }}')
)
select 'missing mandatory ' || m.column_name as problem
from (values {% for c in focus_mandatory_columns() %}('{{ c }}'){{ ", " if not loop.last }}{% endfor %}) as m(column_name)
where m.column_name not in (select column_name from columns)
union all
select 'custom column without x_ prefix: ' || column_name
from columns
where column_name not in ('{{ focus | join("', '") }}') and not starts_with(column_name, 'x_')
union all
select 'custom column before a FOCUS column: ' || column_name
from columns, focus_positions
where starts_with(column_name, 'x_') and ordinal_position < last_focus
