-- Usage intervals with where their billing stops (billed_end_utc): at the end, or -- after
-- a drain signal -- at the signal plus the grace period, whichever is first (macro
-- billed_usage).
{{ billed_usage(ref('stg_usage_intervals')) }}
