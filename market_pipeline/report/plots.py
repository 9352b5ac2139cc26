"""Small PNG charts for operator metadata (matplotlib Agg; no display needed)."""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402


def png_markdown(png: bytes, alt: str = "chart") -> str:
    """Markdown embedding the PNG as a data URI (the Dagster UI renders it)."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"


def lines_png(frame: pl.DataFrame, x: str, y: str, series: str, title: str, ylabel: str) -> bytes | None:
    """One line per value of `series`; None when there is nothing to draw."""
    if frame.is_empty():
        return None
    figure, axes = plt.subplots(figsize=(8, 3.2), dpi=90)
    try:
        for key, group in frame.sort(x).group_by(series, maintain_order=True):
            name = key[0] if isinstance(key, tuple) else key
            axes.step(group[x].to_list(), group[y].to_list(), where="post", label=str(name))
        axes.set_title(title)
        axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, loc="upper left")
        figure.autofmt_xdate()
        buffer = io.BytesIO()
        figure.tight_layout()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(figure)
