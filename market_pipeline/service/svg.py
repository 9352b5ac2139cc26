"""Charts drawn on the server as inline SVG: no JavaScript, nothing fetched by the browser,
and the page's numbers are in the markup (each series and cell carries its data in
`data-*` attributes, which the browser tests read back)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from html import escape

from markupsafe import Markup

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 980, 260, 60, 290, 16, 36


def _num(value: float) -> str:
    return f"{value:.6g}"


def _x(t: dt.datetime) -> float:
    return t.timestamp()


def line_chart(
    chart_id: str, series: Mapping[str, Sequence[tuple[dt.datetime, float]]], y_label: str, step: bool = False
) -> Markup:
    """Lines over time (steps for prices: a price holds until the next one)."""
    points = [p for s in series.values() for p in s]
    if not points:
        return Markup(f'<p class="empty" id="{escape(chart_id)}">no data yet</p>')
    xs = [_x(t) for t, _ in points]
    ys = [v for _, v in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, min(ys)), max(ys) or 1.0
    x1 = x1 if x1 > x0 else x0 + 1
    sx = lambda x: PAD_L + (x - x0) / (x1 - x0) * (W - PAD_L - PAD_R)  # noqa: E731
    sy = lambda y: H - PAD_B - (y - y0) / ((y1 - y0) or 1) * (H - PAD_T - PAD_B)  # noqa: E731
    out = [
        f'<svg id="{escape(chart_id)}" class="chart" role="img" viewBox="0 0 {W} {H}" width="{W}" height="{H}"'
        f' xmlns="http://www.w3.org/2000/svg" aria-label="{escape(y_label)}">',
        f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" stroke="#333"/>',
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" stroke="#333"/>',
        f'<text x="4" y="{PAD_T + 10}" font-size="11">{escape(y_label)}</text>',
    ]
    for frac in (0.0, 0.5, 1.0):
        value = y0 + frac * (y1 - y0)
        out.append(f'<text x="4" y="{sy(value):.1f}" font-size="10">{_num(value)}</text>')
    for frac in (0.0, 1.0):
        t = dt.datetime.fromtimestamp(x0 + frac * (x1 - x0), dt.timezone.utc)
        anchor = "start" if frac == 0 else "end"
        out.append(
            f'<text x="{sx(x0 + frac * (x1 - x0)):.1f}" y="{H - 8}" font-size="10" text-anchor="{anchor}">'
            f"{t:%Y-%m-%d %H:%M}Z</text>"
        )
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        coords: list[str] = []
        for j, (t, v) in enumerate(pts):
            if step and j:
                coords.append(f"{sx(_x(t)):.1f},{sy(pts[j - 1][1]):.1f}")
            coords.append(f"{sx(_x(t)):.1f},{sy(v):.1f}")
        data = json.dumps([[t.isoformat(), v] for t, v in pts])
        dash = ' stroke-dasharray="6 4"' if name.startswith("solver") else ""  # beside the published line
        out.append(
            f'<polyline class="series" fill="none" stroke="{color}" stroke-width="2"{dash}'
            f' data-series="{escape(name)}" data-points="{escape(data)}" points="{" ".join(coords)}"/>'
        )
        legend_y = PAD_T + 14 * (i + 1)
        out.append(
            f'<rect x="{W - PAD_R + 10}" y="{legend_y - 9}" width="10" height="10" fill="{color}"/>'
            f'<text x="{W - PAD_R + 24}" y="{legend_y}" font-size="11">{escape(name)}</text>'
        )
    out.append("</svg>")
    return Markup("".join(out))


def heat_map(
    chart_id: str,
    rows: Sequence[str],
    columns: Sequence[dt.datetime],
    values: Mapping[tuple[str, dt.datetime], float],
) -> Markup:
    """Rows x time columns, the cell's shade its value relative to the row's peak."""
    if not rows or not columns:
        return Markup(f'<p class="empty" id="{escape(chart_id)}">no data yet</p>')
    cell_w = max(4.0, min(24.0, (W - 200) / len(columns)))
    width = max(640.0, 200 + cell_w * len(columns) + 10)
    height = 20 * len(rows) + 30
    top = max(values.values()) if values else 1.0
    out = [
        f'<svg id="{escape(chart_id)}" class="chart heat" role="img" viewBox="0 0 {width:.0f} {height}"'
        f' width="{width:.0f}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for r, row in enumerate(rows):
        out.append(f'<text x="2" y="{20 * r + 14}" font-size="11">{escape(row)}</text>')
        for c, col in enumerate(columns):
            value = values.get((row, col))
            if value is None:
                continue
            shade = 0.1 + 0.9 * (value / top if top else 0)
            out.append(
                f'<rect class="cell" x="{200 + c * cell_w:.1f}" y="{20 * r + 2}" width="{cell_w:.1f}" height="18"'
                f' fill="rgb(214,39,40)" fill-opacity="{shade:.3f}" data-row="{escape(row)}"'
                f' data-col="{col.isoformat()}" data-value="{_num(value)}"><title>{escape(row)} {col:%m-%d %H:00}Z:'
                f" {_num(value)}</title></rect>"
            )
    out.append(
        f'<text x="200" y="{height - 6}" font-size="10">{columns[0]:%Y-%m-%d %H:00}Z .. {columns[-1]:%Y-%m-%d %H:00}Z'
        f" (darker = more demand)</text></svg>"
    )
    return Markup("".join(out))


def stacked_bars(
    chart_id: str, labels: Sequence[str], components: Mapping[str, Sequence[float]], y_label: str
) -> Markup:
    """One bar per label, its components stacked (negative ones, discounts, below zero)."""
    if not labels:
        return Markup(f'<p class="empty" id="{escape(chart_id)}">no data yet</p>')
    ups = [sum(max(0.0, v[i]) for v in components.values()) for i in range(len(labels))]
    downs = [sum(min(0.0, v[i]) for v in components.values()) for i in range(len(labels))]
    y1, y0 = max(ups) or 1.0, min(downs)
    sy = lambda y: PAD_T + (y1 - y) / ((y1 - y0) or 1) * (H - PAD_T - PAD_B)  # noqa: E731
    bar_w = max(6.0, min(60.0, (W - PAD_L - PAD_R) / len(labels) * 0.7))
    gap = (W - PAD_L - PAD_R) / len(labels)
    out = [
        f'<svg id="{escape(chart_id)}" class="chart bars" role="img" viewBox="0 0 {W} {H}" width="{W}"'
        f' height="{H}" xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{PAD_L}" y1="{sy(0):.1f}" x2="{W - PAD_R}" y2="{sy(0):.1f}" stroke="#333"/>',
        f'<text x="4" y="{PAD_T + 10}" font-size="11">{escape(y_label)}</text>',
        f'<text x="4" y="{sy(y1):.1f}" font-size="10">{_num(y1)}</text>',
        f'<text x="4" y="{sy(y0):.1f}" font-size="10">{_num(y0)}</text>',
    ]
    for i, label in enumerate(labels):
        x = PAD_L + i * gap + (gap - bar_w) / 2
        up, down = 0.0, 0.0
        for k, (name, vals) in enumerate(components.items()):
            v = vals[i]
            if v >= 0:
                top, bottom = up + v, up
                up += v
            else:
                top, bottom = down, down + v
                down += v
            out.append(
                f'<rect class="segment" x="{x:.1f}" y="{sy(top):.1f}" width="{bar_w:.1f}"'
                f' height="{max(0.0, sy(bottom) - sy(top)):.1f}" fill="{PALETTE[k % len(PALETTE)]}"'
                f' data-bar="{escape(label)}" data-component="{escape(name)}" data-value="{_num(v)}">'
                f"<title>{escape(label)} {escape(name)}: {_num(v)}</title></rect>"
            )
        out.append(
            f'<text x="{x + bar_w / 2:.1f}" y="{H - 8}" font-size="10" text-anchor="middle">{escape(label)}</text>'
        )
    for k, name in enumerate(components):
        out.append(
            f'<rect x="{W - PAD_R + 10}" y="{PAD_T + 14 * k + 5}" width="10" height="10"'
            f' fill="{PALETTE[k % len(PALETTE)]}"/><text x="{W - PAD_R + 24}" y="{PAD_T + 14 * k + 14}"'
            f' font-size="11">{escape(name)}</text>'
        )
    out.append("</svg>")
    return Markup("".join(out))
