"""The hand-written baseline: one DuckDB query from raw tables to invoice line totals.

It implements the billing rules of the dbt models (grace cut-off, price segments at the
time of use, time/location coefficients, drainability, month-to-date commitment tiers,
SLA credits) with the same fixed-point rounding points, in one statement, so its totals
must equal the dbt invoice lines to the last digit. `bench billing` times it against the
dbt rollup.
"""

from __future__ import annotations


def _rdiv(a: str, b: str) -> str:
    """round_half_up(a / b) for integers a >= 0 (the dbt macro rdiv)."""
    return f"((2 * ({a}) + ({b})) // (2 * ({b})))"


def _scale(nano: str, factor_e6: str) -> str:
    return _rdiv(f"({nano}) * ({factor_e6})", "1000000")


def _money(nano: str) -> str:
    return (
        f"(cast(({nano}) // 1000000000 as decimal(18, 9))"
        f" + cast(({nano}) % 1000000000 as decimal(9, 0)) * 0.000000001::decimal(9, 9))"
    )


def _e6(x: str) -> str:
    return f"cast(({x}) * 1000000 as bigint)"


_CONTRACTED = _scale(_scale(_rdiv("gs4 * cp6", "36000"), "t6"), "l6")
_BILLED = _scale(_CONTRACTED, "1000000 - d6")
_EFFECTIVE_UNIT = _scale(_scale(_scale("cp6 * 1000", "t6"), "l6"), "1000000 - d6")
_AFFECTED = _rdiv("cast(ov * f4 AS hugeint) * eun", "36000000")

INVOICE_TOTALS_SQL = f"""
WITH terms AS (SELECT * FROM billing_terms),
usage AS (
    SELECT task_id, tenant_id, pool_id, zone, resource_class, platform_fault,
           cast(gpu_fraction * 10000 AS bigint) AS f4, s, e, h, b,
           greatest(b, s + INTERVAL 1 MICROSECOND) AS bp
    FROM (SELECT *, date_trunc('hour', s) AS h,
                 CASE WHEN d IS NULL THEN e
                      ELSE least(e, greatest(s, d + to_seconds((SELECT grace_seconds FROM terms)))) END AS b
          FROM (SELECT *, make_timestamp(epoch_us(started_at)) AS s, make_timestamp(epoch_us(ended_at)) AS e,
                       make_timestamp(epoch_us(drain_signal_at)) AS d
                FROM usage_intervals))
),
book AS (SELECT pool_id, resource_class, make_timestamp(epoch_us(effective_from)) AS f, price_per_gpu_hour AS p
         FROM price_book),
cuts AS (SELECT pool_id, timestamp '1970-01-01' AS f FROM billing_rate_card_pools
         UNION SELECT pool_id, timestamp '1970-01-01' FROM book
         UNION SELECT pool_id, f FROM book),
seg AS (SELECT pool_id, f, coalesce(lead(f) OVER (PARTITION BY pool_id ORDER BY f),
                                    timestamp '2200-01-01') AS t FROM cuts),
seg_g AS (SELECT seg.*, g.p AS gp FROM seg ASOF LEFT JOIN (SELECT * FROM book WHERE resource_class = 'guaranteed') g
          ON g.pool_id = seg.pool_id AND seg.f >= g.f),
seg_d AS (SELECT seg_g.*, d.p AS dp FROM seg_g ASOF LEFT JOIN (SELECT * FROM book WHERE resource_class = 'drainable') d
          ON d.pool_id = seg_g.pool_id AND seg_g.f >= d.f),
prices AS (
    SELECT pool_id, rc, f, t, {_e6("lp")} AS lp6, {_e6("cp")} AS cp6
    FROM (SELECT s.pool_id, k.rc, s.f, s.t, coalesce(s.gp, c.base_price_per_gpu_hour) AS lp,
                 CASE WHEN k.rc = 'guaranteed' THEN coalesce(s.gp, c.base_price_per_gpu_hour)
                      ELSE coalesce(s.dp, cast(round(coalesce(s.gp, c.base_price_per_gpu_hour)
                           * (1 - (SELECT drainable_default_discount FROM terms)), 6) AS decimal(18, 6))) END AS cp
          FROM seg_d s LEFT JOIN billing_rate_card_pools c USING (pool_id)
          CROSS JOIN (VALUES ('guaranteed'), ('drainable')) k(rc))
),
span AS (SELECT min(h) AS lo, max(h) + INTERVAL 1 HOUR AS hi FROM usage),
price_hours AS (
    SELECT pool_id, rc, f, t, lp6, cp6,
           unnest(generate_series(date_trunc('hour', greatest(f, lo)), least(t, hi) - INTERVAL 1 MICROSECOND,
                                  INTERVAL 1 HOUR)) AS h
    FROM prices, span WHERE t > lo AND f < hi
),
time_card AS (SELECT day_of_week, hour_of_day, {_e6("coefficient")} AS t6 FROM billing_rate_card_time),
zones AS (SELECT zone, {_e6("location_coefficient")} AS l6 FROM billing_rate_card_zones),
tiers AS (
    SELECT m.tenant_id, m.h, {_e6("coalesce(c.discount, 0)")} AS d6
    FROM (SELECT tenant_id, h, cast(coalesce(sum(gs) OVER (PARTITION BY tenant_id, date_trunc('month', h)
                 ORDER BY h ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS bigint) AS mtd
          FROM (SELECT tenant_id, h, sum(date_diff('second', s, b) * f4) AS gs FROM usage GROUP BY ALL)) m
    ASOF LEFT JOIN (SELECT cast(min_gpu_hours * 36000000 AS bigint) AS m, discount
                    FROM billing_commitment_tiers) c ON m.mtd >= c.m
),
rated AS (
    SELECT u.task_id, u.tenant_id, u.pool_id, u.resource_class, u.h, u.f4,
           greatest(u.s, p.f) AS rs, greatest(greatest(u.s, p.f), least(u.b, p.t)) AS re,
           date_diff('second', greatest(u.s, p.f), greatest(greatest(u.s, p.f), least(u.b, p.t))) * u.f4 AS gs4,
           p.cp6, tc.t6, z.l6, ti.d6
    FROM usage u
    LEFT JOIN price_hours p ON p.pool_id = u.pool_id AND p.rc = u.resource_class AND p.h = u.h
         AND p.t > u.s AND p.f < u.bp
    LEFT JOIN time_card tc ON tc.day_of_week = isodow(u.h) AND tc.hour_of_day = hour(u.h)
    LEFT JOIN zones z ON z.zone = u.zone
    LEFT JOIN tiers ti ON ti.tenant_id = u.tenant_id AND ti.h = u.h
),
usage_lines AS (
    SELECT tenant_id, pool_id, resource_class, h, 'Usage' AS cat, sum({_money(_BILLED)}) AS billed
    FROM rated GROUP BY ALL
),
faults AS (
    SELECT task_id, tenant_id, pool_id, resource_class, h, max(e) AS fe,
           max(e) - to_seconds((SELECT sla_credit_window_seconds FROM terms)) AS ff
    FROM usage WHERE platform_fault GROUP BY task_id, tenant_id, pool_id, resource_class, h
),
credit_rows AS (
    SELECT f.task_id, f.fe, f.tenant_id, f.pool_id, f.resource_class, f.h, r.f4,
           greatest(0, date_diff('second', greatest(r.rs, f.ff), least(r.re, f.fe))) AS ov,
           {_EFFECTIVE_UNIT} AS eun
    FROM faults f LEFT JOIN rated r ON r.task_id = f.task_id
         AND r.h >= date_trunc('hour', f.ff) AND r.h <= f.h AND r.re > f.ff AND r.rs < f.fe
),
credit_lines AS (
    SELECT tenant_id, pool_id, resource_class, h, 'Credit' AS cat,
           sum(-{_money(_rdiv("coalesce(affected, 0) * " + _e6("(SELECT sla_credit_rate FROM terms)"), "1000000"))})
               AS billed
    FROM (SELECT task_id, fe, tenant_id, pool_id, resource_class, h, sum({_AFFECTED}) AS affected
          FROM credit_rows GROUP BY ALL)
    GROUP BY ALL
),
lines AS (SELECT * FROM usage_lines UNION ALL SELECT * FROM credit_lines)
SELECT tenant_id, 'hour' AS period_grain, h AS period_start_utc, pool_id, resource_class, cat AS charge_category,
       cast(billed AS decimal(38, 9)) AS billed_cost
FROM lines
UNION ALL
SELECT tenant_id, 'day', date_trunc('day', h), pool_id, resource_class, cat, cast(sum(billed) AS decimal(38, 9))
FROM lines GROUP BY tenant_id, date_trunc('day', h), pool_id, resource_class, cat
"""
