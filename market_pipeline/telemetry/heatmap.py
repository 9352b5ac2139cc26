"""Per-GPU SM-utilisation heatmap of a partition (PNG bytes, matplotlib Agg).

Rows are GPUs ordered by (node, index); a fleet larger than `max_rows` GPUs is shown in
bands of consecutive GPUs (band mean), so the picture stays readable at 8,000 GPUs.
Columns are time buckets of at least one minute, at most `max_columns` of them.
"""

from __future__ import annotations

import io
import math

import numpy as np
import polars as pl


def utilisation_matrix(
    clean: pl.DataFrame, max_rows: int = 64, max_columns: int = 120
) -> tuple[np.ndarray, list[str], list[str]]:
    """Mean SM utilisation per (GPU band, time bucket), with row and column labels."""
    if clean.is_empty():
        return np.zeros((0, 0)), [], []
    gpus = (
        clean.select("node_id", "gpu_index", "gpu_uuid")
        .unique()
        .sort("node_id", "gpu_index", "gpu_uuid")
        .with_row_index("gpu_row")
    )
    band_size = max(1, math.ceil(gpus.height / max_rows))
    gpus = gpus.with_columns((pl.col("gpu_row") // band_size).alias("band"))
    start, end = clean.get_column("ts").min(), clean.get_column("ts").max()
    span_minutes = max(1.0, (end - start).total_seconds() / 60 + 1)
    bucket_minutes = max(1, math.ceil(span_minutes / max_columns))
    bucketed = (
        clean.join(
            gpus.select("gpu_uuid", "node_id", "gpu_index", "band"), on=["gpu_uuid", "node_id", "gpu_index"]
        )
        .with_columns(pl.col("ts").dt.truncate(f"{bucket_minutes}m").alias("bucket"))
        .group_by("band", "bucket")
        .agg(pl.col("sm_util_pct").mean().alias("util"))
    )
    buckets = bucketed.get_column("bucket").unique().sort()
    bucket_position = {b: i for i, b in enumerate(buckets.to_list())}
    bands = int(gpus.get_column("band").max()) + 1
    matrix = np.full((bands, len(bucket_position)), np.nan)
    for band, bucket, util in bucketed.iter_rows():
        matrix[band, bucket_position[bucket]] = util
    row_labels = _band_labels(gpus, band_size)
    column_labels = [b.strftime("%H:%M") for b in buckets.to_list()]
    return matrix, row_labels, column_labels


def _band_labels(gpus: pl.DataFrame, band_size: int) -> list[str]:
    labels = []
    for band in gpus.partition_by("band", maintain_order=True):
        first, last = band.row(0, named=True), band.row(-1, named=True)
        if band_size == 1:
            labels.append(f"{first['node_id']}/{first['gpu_index']}")
        else:
            labels.append(f"{first['node_id']}/{first['gpu_index']}…{last['node_id']}/{last['gpu_index']}")
    return labels


def utilisation_heatmap_png(
    clean: pl.DataFrame, title: str = "SM utilisation (%)", max_rows: int = 64, max_columns: int = 120
) -> bytes | None:
    """The heatmap as PNG bytes; None when there are no clean samples to draw."""
    matrix, rows, columns = utilisation_matrix(clean, max_rows, max_columns)
    if matrix.size == 0:
        return None
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    height = min(9.0, 1.5 + 0.14 * len(rows))
    figure, axes = plt.subplots(figsize=(9.0, height), dpi=80)
    try:
        image = axes.imshow(
            np.ma.masked_invalid(matrix),
            aspect="auto",
            cmap="viridis",
            vmin=0,
            vmax=100,
            interpolation="nearest",
        )
        figure.colorbar(image, ax=axes, label="SM util %")
        axes.set_title(title)
        axes.set_xlabel("time (UTC)")
        axes.set_ylabel("GPU (node/index)")
        step = max(1, len(columns) // 12)
        axes.set_xticks(range(0, len(columns), step), columns[::step], fontsize=7)
        label_step = max(1, len(rows) // 32)
        axes.set_yticks(range(0, len(rows), label_step), rows[::label_step], fontsize=6)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
    finally:
        plt.close(figure)
    return buffer.getvalue()
