-- Metered usage, one row per task, GPU and hour, with its metered seconds.
-- *_utc columns are naive UTC timestamps for hour/day arithmetic (macro usage_interval_columns).
{{ usage_interval_columns(source('warehouse', 'usage_intervals')) }}
