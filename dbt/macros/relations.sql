{#- Render refs and sources as bare table names, resolved through the search_path
    (warehouse.main): a DuckDB file's catalog is named after the file, so views that
    spelled out a catalog would break when finance opens the warehouse under another name. -#}
{% macro ref() %}
  {%- set relation = builtins.ref(*varargs, **kwargs) -%}
  {%- do return(relation.include(database=False, schema=False)) -%}
{% endmacro %}

{% macro source() %}
  {%- set relation = builtins.source(*varargs, **kwargs) -%}
  {%- do return(relation.include(database=False, schema=False)) -%}
{% endmacro %}
