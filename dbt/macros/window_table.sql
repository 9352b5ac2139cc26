{#- Materialization `window_table` (DuckDB): a table whose rows are owned by hours, rewritten
    a window at a time, in one transaction (DuckDB's DDL and DML are transactional, so no
    intermediate table, rename or backup is needed, as dbt's generic incremental
    materialization does for databases without transactional DDL).
      - first build, --full-refresh, no window vars (every hour: the table is rebuilt, so a
        model whose columns changed needs no --full-refresh), or a view in the way:
        CREATE OR REPLACE TABLE ... AS
      - otherwise: delete the window's rows, insert the model's rows (by column name).
    A crash anywhere rolls the transaction back; a rerun of a window gives identical rows
    (exactly once). A window run of a model whose columns changed fails (the insert by name
    fails on a column the table lacks rather than dropping it silently): rebuild it once
    without window vars or with --full-refresh. A model with an enforced contract is checked
    against its declared columns and types first.
    Model config:
      window_column: the naive-UTC timestamp column that places a row in time
      window_grain: 'hour' | 'day' | 'hour_and_day' (then `period_grain` says which). -#}
{% materialization window_table, adapter='duckdb' %}
  {%- set existing = load_cached_relation(this) -%}
  {%- set target = this.incorporate(type='table') -%}
  {%- set rebuild = should_full_refresh() or existing is none or existing.is_view
                    or window_is_everything() -%}
  {#- an enforced contract: the model's column names and types must be the declared ones
      (checked on the query's schema before anything is written) -#}
  {%- if config.get('contract').enforced -%}
    {% do get_assert_columns_equivalent(compiled_code) %}
  {%- endif -%}

  {{ run_hooks(pre_hooks, inside_transaction=False) }}
  {{ run_hooks(pre_hooks, inside_transaction=True) }}
  {% if existing is not none and existing.is_view %}
    {% do adapter.drop_relation(existing) %}
  {% endif %}
  {% call statement('main') -%}
    {%- if rebuild -%}
      create or replace table {{ target }} as (
        {{ compiled_code }}
      )
    {%- else -%}
      {{ window_delete_sql(target) }};
      insert into {{ target }} by name select * from (
        {{ compiled_code }}
      )
    {%- endif -%}
  {%- endcall %}
  {% do persist_docs(target, model) %}
  {{ run_hooks(post_hooks, inside_transaction=True) }}
  {% do adapter.commit() %}
  {{ run_hooks(post_hooks, inside_transaction=False) }}
  {{ return({'relations': [target]}) }}
{% endmaterialization %}

{% macro window_delete_sql(target) -%}
  {%- set column = config.require('window_column') -%}
  {%- set grain = config.get('window_grain', 'hour') -%}
  delete from {{ target }} where
  {%- if grain == 'hour_and_day' %}
    (period_grain = 'hour' and {{ in_window(column, 'hour') }})
    or (period_grain = 'day' and {{ in_window(column, 'day') }})
  {%- else %}
    {{ in_window(column, grain) }}
  {%- endif %}
{%- endmacro %}

{#- True when the window vars are the defaults of dbt_project.yml: every hour. -#}
{% macro window_is_everything() -%}
  {{ return((var('min_date') | string) == '1970-01-01T00:00:00+00:00'
            and (var('max_date') | string) == '2200-01-01T00:00:00+00:00') }}
{%- endmacro %}
