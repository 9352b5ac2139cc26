"""A tenant's cost report: why the bill is what it is, line by line, so a tenant can check it.

Daily breakdown (base, time-of-day premium, location premium, drainability and commitment
discounts, SLA credits), the price history of the pools the tenant used, and its SLA
credits. Every number comes from a tenant-scoped query, so a report can never show
another tenant's rows. Renders HTML (charts embedded as PNG) or a single PNG.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import polars as pl

from market_pipeline.billing.errors import BillingError
from market_pipeline.billing.tenant_scope import tenant_query
from market_pipeline.warehouse import Warehouse, billing_readers

COMPONENTS = (
    "base_cost",
    "time_premium",
    "location_premium",
    "drainability_discount",
    "commitment_discount",
    "sla_credits",
)


@dataclass(frozen=True)
class CostReportData:
    tenant_id: str
    daily: pl.DataFrame
    prices: pl.DataFrame
    credits: pl.DataFrame
    totals: dict[str, Decimal]


def collect(warehouse: Warehouse, tenant_id: str) -> CostReportData:
    def run(sql: str, params: list[object]) -> pl.DataFrame:
        return tenant_query(warehouse, tenant_id, sql, params)

    daily = billing_readers.cost_report_daily(run)
    pools = billing_readers.cost_report_pools(run)
    pool_ids = pools["pool_id"].to_list()
    prices = billing_readers.cost_report_prices(run, pool_ids) if pool_ids else pl.DataFrame()
    credits = billing_readers.cost_report_credits(run)
    totals = {
        c: Decimal(daily[c].sum() or 0) if daily.height else Decimal(0)
        for c in (*COMPONENTS, "billed_cost", "gpu_hours")
    }
    return CostReportData(tenant_id, daily, prices, credits, totals)


def _figure_png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def charts(data: CostReportData):
    """A matplotlib figure: daily components (stacked bars) and price history (lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8))
    if data.daily.height:
        days = [str(d) for d in data.daily["day"].to_list()]
        positive = [0.0] * len(days)
        negative = [0.0] * len(days)
        for component in COMPONENTS:
            values = [float(v) for v in data.daily[component].to_list()]
            bottoms = [p if v >= 0 else n for v, p, n in zip(values, positive, negative)]
            top.bar(days, values, bottom=bottoms, label=component.replace("_", " "))
            positive = [p + max(v, 0) for p, v in zip(positive, values)]
            negative = [n + min(v, 0) for n, v in zip(negative, values)]
        top.plot(days, [float(v) for v in data.daily["billed_cost"].to_list()], "k.-", label="billed")
        top.legend(fontsize=8)
    top.set_title(f"{data.tenant_id}: daily cost breakdown")
    top.axhline(0, color="grey", linewidth=0.5)
    if data.prices.height:
        for (pool, cls), group in data.prices.group_by(["pool_id", "resource_class"], maintain_order=True):
            bottom.step(
                group["effective_from"].to_list(),
                [float(v) for v in group["price_per_gpu_hour"]],
                where="post",
                label=f"{pool} {cls}",
            )
        bottom.legend(fontsize=8)
    bottom.set_title("price per GPU-hour (price book) in the pools used")
    fig.tight_layout()
    return fig


def _table(frame: pl.DataFrame) -> str:
    if frame.is_empty():
        return "<p>none</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
        for row in frame.iter_rows()
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def render_html(data: CostReportData) -> str:
    import matplotlib.pyplot as plt

    fig = charts(data)
    image = base64.b64encode(_figure_png(fig)).decode()
    plt.close(fig)
    totals = "".join(
        f"<tr><td>{k.replace('_', ' ')}</td><td>{v:.2f}</td></tr>" for k, v in data.totals.items()
    )
    explain = (
        "base = list price x GPU-hours; time premium = base x (time coefficient - 1); location"
        " premium = the zone coefficient on top; drainability discount = the gap to the drainable"
        " class price; commitment discount = your month-to-date tier; SLA credits = platform-caused"
        " failures, credited at the SLA rate."
    )
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>Cost report {html.escape(data.tenant_id)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}</style></head><body>
<h1>Cost report: {html.escape(data.tenant_id)}</h1>
<h2>Totals</h2><table>{totals}</table><p>{html.escape(explain)}</p>
<img alt="cost breakdown and price history" src="data:image/png;base64,{image}">
<h2>Daily breakdown</h2>{_table(data.daily)}
<h2>SLA credits</h2>{_table(data.credits)}
</body></html>"""


def write_report(warehouse: Warehouse, tenant_id: str, out: Path, fmt: str = "html") -> Path:
    if fmt not in ("html", "png"):
        raise BillingError(f"--format must be html or png, got {fmt!r}")
    data = collect(warehouse, tenant_id)
    if out.is_dir():
        raise BillingError(f"--out {out} is a directory; name the report file")
    if fmt == "html":
        payload = render_html(data).encode()
    else:
        import matplotlib.pyplot as plt

        fig = charts(data)
        payload = _figure_png(fig)
        plt.close(fig)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    partial.write_bytes(payload)  # whole or not at all: a reader never sees half a report
    partial.replace(out)
    return out
