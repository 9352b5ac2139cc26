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

{#- Usage rows whose hour is in the window, as a bound on the raw `started_at`: an interval
    starts within its usage_hour, so for bounds on the hour (check_window_vars) this selects
    exactly the rows whose usage_hour is in [lo, hi). On the raw column it costs no per-row
    conversion and lets DuckDB skip the row groups of the time-ordered usage table outside
    the window: an hourly run reads its hours, not every hour ever metered.
    `lo`/`hi`: naive-UTC bounds on the hour (default: the window, or its whole days for
    grain 'day'). -#}
{% macro usage_in_window(grain='hour', lo=none, hi=none) -%}
{%- do check_window_vars() -%}
{%- set lo = lo or (window_day_start() if grain == 'day' else window_start()) -%}
{%- set hi = hi or (window_day_end() if grain == 'day' else window_end()) -%}
(started_at >= timezone('UTC', {{ lo }}) and started_at < timezone('UTC', {{ hi }}))
{%- endmacro %}

{#- Billing windows are whole UTC hours (market_pipeline.billing.dbt_project.window_vars
    checks the same); fail at compile time on vars that are not. A naive timestamp is UTC. -#}
{% macro check_window_vars() -%}
{%- set utc = modules.pytz.utc -%}
{%- for name in ['min_date', 'max_date'] -%}
  {%- set text = var(name) | string -%}
  {%- set parsed = modules.datetime.datetime.fromisoformat(text) -%}
  {%- set value = parsed if parsed.tzinfo else parsed.replace(tzinfo=utc) -%}
  {%- if value.timestamp() % 3600 != 0 -%}
    {{ exceptions.raise_compiler_error("billing window var " ~ name ~ "=" ~ text ~ " is not on a whole UTC hour") }}
  {%- endif -%}
{%- endfor -%}
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
