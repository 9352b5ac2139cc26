{#- The billing window [min_date, max_date) from vars, as naive UTC timestamps. Models work
    in naive UTC internally (timezone('UTC', ts)) so no session time zone can shift an hour. -#}
{% macro window_start() -%}
timezone('UTC', cast('{{ var("min_date") }}' as timestamptz))
{%- endmacro %}

{% macro window_end() -%}
timezone('UTC', cast('{{ var("max_date") }}' as timestamptz))
{%- endmacro %}

{#- The whole days the window touches (daily invoice lines are recomputed for whole days). -#}
{% macro window_day_start() -%}
date_trunc('day', {{ window_start() }})
{%- endmacro %}

{% macro window_day_end() -%}
(date_trunc('day', {{ window_end() }} - interval 1 microsecond) + interval 1 day)
{%- endmacro %}

{% macro in_window(column, grain='hour') -%}
{%- if grain == 'day' -%}
({{ column }} >= {{ window_day_start() }} and {{ column }} < {{ window_day_end() }})
{%- else -%}
({{ column }} >= {{ window_start() }} and {{ column }} < {{ window_end() }})
{%- endif -%}
{%- endmacro %}

{#- Incremental strategy `window_replace`: in the model's transaction, delete the rows of
    the window and insert the window's fresh rows. A rerun of a window gives identical rows
    (exactly once); a crash rolls the transaction back. Model config:
      window_column: the naive-UTC timestamp column that places a row in time
      window_grain: 'hour' | 'day' | 'hour_and_day' (then `period_grain` says which). -#}
{% macro get_incremental_window_replace_sql(arg_dict) -%}
  {%- set target = arg_dict['target_relation'] -%}
  {%- set source = arg_dict['temp_relation'] -%}
  {%- set columns = get_quoted_csv(arg_dict['dest_columns'] | map(attribute='name')) -%}
  {%- set column = config.require('window_column') -%}
  {%- set grain = config.get('window_grain', 'hour') -%}
  delete from {{ target }} where
  {%- if grain == 'hour_and_day' %}
    (period_grain = 'hour' and {{ in_window(column, 'hour') }})
    or (period_grain = 'day' and {{ in_window(column, 'day') }})
  {%- else %}
    {{ in_window(column, grain) }}
  {%- endif %};
  insert into {{ target }} ({{ columns }}) select {{ columns }} from {{ source }}
{%- endmacro %}

{#- TIMESTAMPTZ <-> naive UTC TIMESTAMP through epoch microseconds: independent of the
    session time zone and ~25x faster than timezone('UTC', ...) in DuckDB. utc_tz keeps
    whole seconds (billing times are whole seconds). -#}
{% macro utc_naive(ts) -%}
make_timestamp(epoch_us({{ ts }}))
{%- endmacro %}

{% macro utc_tz(naive) -%}
to_timestamp(epoch_us({{ naive }}) // 1000000)
{%- endmacro %}
