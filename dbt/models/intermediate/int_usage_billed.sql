-- Where billing of each interval stops: at its end, or -- after a drain signal -- at the
-- signal plus the grace period, whichever is first (never before the interval's start).
-- After the grace period billing stops whether the task is then drained, exits or fails.
with terms as (
    select grace_seconds from {{ ref('stg_billing_terms') }}
),

cut as (
    select
        u.*,
        case
            when u.drain_signal_at_utc is null then u.ended_at_utc
            else least(
                u.ended_at_utc,
                greatest(u.started_at_utc,
                         u.drain_signal_at_utc + to_seconds((select grace_seconds from terms)))
            )
        end as billed_end_utc
    from {{ ref('stg_usage_intervals') }} as u
)

select
    *,
    date_diff('second', started_at_utc, billed_end_utc) as billable_seconds,
    -- for joining price segments: a zero-length interval still finds the segment it is in
    greatest(billed_end_utc, started_at_utc + interval 1 microsecond) as billed_probe_end_utc
from cut
