"""Plots (matplotlib, Agg) and the self-contained HTML page of a simulation report."""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from market_pipeline.lab.simulate.report import (  # noqa: E402
    placement_table_markdown,
    strategy_table_markdown,
    targets_table_markdown,
)

COLORS = {
    "static": "#7f7f7f",
    "utilization": "#1f77b4",
    "stackelberg": "#d62728",
    "clairvoyant": "#2ca02c",
    "claims": "#ff7f0e",
}


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def price_plot(report: dict[str, Any]) -> bytes:
    series = report["series"]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for name, s in series["strategies"].items():
        color = COLORS.get(name)
        ax.plot(series["hours"], s["price_guaranteed_rel"], color=color, label=f"{name} guaranteed")
        if name == "stackelberg":
            ax.plot(
                series["hours"],
                s["price_drainable_rel"],
                color=color,
                linestyle="--",
                label=f"{name} drainable",
            )
    ax.set_xlabel("hour")
    ax.set_ylabel("price / list price (capacity-weighted)")
    ax.set_title("Price over time")
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)


def utilization_plot(report: dict[str, Any]) -> bytes:
    series = report["series"]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for name, s in series["strategies"].items():
        ax.plot(series["hours"], s["utilization"], color=COLORS.get(name), label=name)
    load = series.get("load_index")
    if load is not None:
        ratio = report["inputs"]["target_utilization"]
        ax.plot(
            series["hours"],
            [v * ratio for v in load],
            color="black",
            linewidth=0.8,
            linestyle=":",
            label="offered load (list price) / capacity",
        )
    ax.set_xlabel("hour")
    ax.set_ylabel("allocated GPUs / capacity")
    ax.set_title("GPU utilisation over time")
    ax.legend(fontsize=7)
    return _png(fig)


def cost_plot(report: dict[str, Any]) -> bytes:
    names = list(report["strategies"])
    fig, ax = plt.subplots(figsize=(6, 3.2))
    width = 0.38
    for offset, (key, label) in enumerate(
        (("elastic_cost_per_gpu_hour", "elastic"), ("rigid_cost_per_gpu_hour", "rigid"))
    ):
        values = [report["strategies"][n].get(key) or 0.0 for n in names]
        ax.bar([i + (offset - 0.5) * width for i in range(len(names))], values, width, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("cost per GPU-hour")
    ax.set_title("Cost by tenant class")
    ax.legend(fontsize=8)
    return _png(fig)


def placement_plot(report: dict[str, Any]) -> bytes:
    placement = report.get("placement", {})
    names = list(placement)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar(names, [placement[n]["unallocated_gpus_at_saturation"] for n in names], color="#2ca02c")
    for i, n in enumerate(names):
        ax.annotate(
            f"{placement[n]['allocation_ratio']:.3f}",
            (i, placement[n]["unallocated_gpus_at_saturation"]),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylabel("unallocated GPUs at saturation")
    ax.set_title("Placement at saturation (label: allocation ratio)")
    return _png(fig)


def summary_png(report: dict[str, Any]) -> bytes:
    """One figure for dashboards: utilisation over time and cost by tenant class."""
    series = report["series"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw={"width_ratios": [2, 1]})
    for name, s in series["strategies"].items():
        left.plot(series["hours"], s["utilization"], color=COLORS.get(name), label=name)
    left.set_title("GPU utilisation")
    left.set_xlabel("hour")
    left.legend(fontsize=7)
    names = list(report["strategies"])
    for offset, key in enumerate(("elastic_cost_per_gpu_hour", "rigid_cost_per_gpu_hour")):
        right.bar(
            [i + (offset - 0.5) * 0.38 for i in range(len(names))],
            [report["strategies"][n].get(key) or 0.0 for n in names],
            0.38,
            label=key.split("_")[0],
        )
    right.set_xticks(range(len(names)), names, fontsize=7)
    right.set_title("cost per GPU-hour")
    right.legend(fontsize=7)
    return _png(fig)


def _img(data: bytes, alt: str) -> str:
    return f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def _md_table(markdown: str) -> str:
    rows = [line.strip("|").split("|") for line in markdown.splitlines() if not set(line) <= set("|-")]
    head, body = rows[0], rows[1:]
    out = ["<table><tr>" + "".join(f"<th>{html.escape(c.strip())}</th>" for c in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in row) + "</tr>" for row in body]
    return "\n".join(out) + "</table>"


def render_html(report: dict[str, Any]) -> str:
    plots = [
        _img(price_plot(report), "price over time"),
        _img(utilization_plot(report), "utilisation over time"),
        _img(cost_plot(report), "cost by tenant class"),
    ]
    if report.get("placement"):
        plots.append(_img(placement_plot(report), "placement comparison"))
    facts = {k: report["inputs"][k] for k in report["inputs"] if k not in ("pools",)}
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Market simulation</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:auto}}table{{border-collapse:collapse;margin:8px 0}}
td,th{{border:1px solid #ccc;padding:3px 7px;text-align:right}}th{{background:#eee}}pre{{background:#f6f6f6;padding:8px}}</style>
</head><body><h1>Offline market simulation</h1><p>generated {html.escape(str(report.get("generated_at")))}</p>
<h2>Strategies</h2>{_md_table(strategy_table_markdown(report))}
<h2>Targets</h2>{_md_table(targets_table_markdown(report))}
<h2>Placement at saturation</h2>{_md_table(placement_table_markdown(report)) if report.get("placement") else "<p>not run</p>"}
<h2>Plots</h2>{"".join(plots)}
<h2>Inputs</h2><pre>{html.escape(json.dumps(facts, indent=1))}</pre>
<h2>Assumptions</h2><ul>{"".join(f"<li>{html.escape(n)}</li>" for n in report.get("model_notes", []))}</ul><pre>{html.escape(json.dumps(report.get("assumptions"), indent=1))}</pre>
<h2>Settings and timing</h2><pre>{html.escape(json.dumps({"settings": report.get("settings"), "timing": report.get("timing")}, indent=1))}</pre>
</body></html>"""
