"""Per-GPU utilisation model and telemetry synthesis for the twin.

Between two fleet events every GPU's load is constant, so a run of sample ticks is one
vectorised draw over (ticks x GPUs):

- SM utilisation: sum over the GPU's tasks of util_level x share (training), plus the same
  for inference tasks scaled by the arrival profile's factor at the tick (inference load
  follows demand), plus N(0, 3) noise on busy GPUs; idle GPUs read 0;
- memory: the tasks' reserved GPU memory x their in-use share, +-1% noise;
- power: idle + (TDP - idle) x util, N(0, 2% TDP) noise; temperature 30 C + 0.45 C per util
  point + 0.15 C per slot position (airflow), N(0, 0.7) noise.

Noise comes from per-hour blocks `default_rng([seed, STREAM_NOISE, block])` drawn for every
catalog GPU, so a tick's values do not depend on how the caller chunks time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from market_pipeline.fleet.catalog import FleetCatalog
from market_pipeline.fleet.workload import STREAM_NOISE
from market_pipeline.hardware.protocol import SAMPLE_SCHEMA

SM_NOISE_PCT = 3.0
POWER_NOISE_SHARE = 0.02
TEMP_NOISE_C = 0.7
AMBIENT_C = 30.0


@dataclass(frozen=True)
class GpuShare:
    """One task's hold on one GPU."""

    task_id: str
    tenant_id: str
    share: float  # compute share (milli / 1000)
    util_level: float
    inference: bool
    mem_mib: float  # GPU memory in use
    mig_profile: str | None


class GpuLoad:
    """Aggregated load per catalog GPU, recomputed exactly from its holders on each change."""

    def __init__(self, catalog: FleetCatalog) -> None:
        n = catalog.n_gpus
        self.holders: list[dict[str, GpuShare]] = [{} for _ in range(n)]
        self.train = np.zeros(n)
        self.infer = np.zeros(n)
        self.mem_used = np.zeros(n)
        self.busy = np.zeros(n, dtype=bool)
        self.task = np.full(n, None, dtype=object)
        self.tenant = np.full(n, None, dtype=object)
        self.mig = np.full(n, None, dtype=object)
        # string labels as codes into one table (0 = null), so sample batches stay numeric
        self.labels: list[str | None] = [None]
        self._label_code: dict[str | None, int] = {None: 0}
        self.codes = np.zeros((n, 3), dtype=np.int32)  # task, tenant, MIG profiles
        specs = [catalog.models[catalog.nodes[row].gpu_model] for row in catalog.gpu_node_row]
        self.mem_total = np.array([s.memory_mib for s in specs], dtype=np.float64)
        self.tdp = np.array([s.tdp_w for s in specs], dtype=np.float64)
        self.idle_w = np.array([s.idle_w for s in specs], dtype=np.float64)
        self.slot = catalog.gpu_slot.astype(np.float64)
        self.gpu_index = catalog.gpu_slot.astype(np.int32)
        self.node_ids = pl.Series([catalog.nodes[row].node_id for row in catalog.gpu_node_row], dtype=pl.Utf8)
        self.uuids = pl.Series(list(catalog.gpu_uuids), dtype=pl.Utf8)

    def add(self, positions: list[int], share: GpuShare) -> None:
        for g in positions:
            self.holders[g][share.task_id] = share
            self._recompute(g)

    def remove(self, positions: list[int], task_id: str) -> None:
        for g in positions:
            self.holders[g].pop(task_id, None)
            self._recompute(g)

    def _recompute(self, g: int) -> None:
        # a canonical order keeps float sums identical after a state reload
        holders = [self.holders[g][t] for t in sorted(self.holders[g])]
        self.busy[g] = bool(holders)
        self.train[g] = sum(h.util_level * h.share for h in holders if not h.inference)
        self.infer[g] = sum(h.util_level * h.share for h in holders if h.inference)
        self.mem_used[g] = min(sum(h.mem_mib for h in holders), self.mem_total[g])
        # the sample row names the task holding the largest share (ties: smallest id)
        top = min(holders, key=lambda h: (-h.share, h.task_id), default=None)
        self.task[g] = top.task_id if top else None
        self.tenant[g] = top.tenant_id if top else None
        profiles = sorted(h.mig_profile for h in holders if h.mig_profile)
        self.mig[g] = ",".join(profiles) if profiles else None
        self.codes[g] = [self._code(self.task[g]), self._code(self.tenant[g]), self._code(self.mig[g])]

    def _code(self, label: str | None) -> int:
        code = self._label_code.get(label)
        if code is None:
            code = self._label_code[label] = len(self.labels)
            self.labels.append(label)
        return code


class NoiseBlocks:
    """Standard-normal noise (ticks x GPUs x 3) from per-block streams, cached per block."""

    def __init__(self, seed: int, n_gpus: int, ticks_per_block: int) -> None:
        self.seed, self.n_gpus, self.ticks_per_block = seed, n_gpus, ticks_per_block
        self._cache: dict[int, np.ndarray] = {}

    def _block(self, block: int) -> np.ndarray:
        if block not in self._cache:
            if len(self._cache) > 2:
                self._cache.clear()
            rng = np.random.default_rng([self.seed, STREAM_NOISE, block])
            self._cache[block] = rng.standard_normal((self.ticks_per_block, self.n_gpus, 3), dtype=np.float32)
        return self._cache[block]

    def take(self, ticks: np.ndarray) -> np.ndarray:
        """Noise for tick indices `ticks` (sample number since the epoch)."""
        blocks = ticks // self.ticks_per_block
        if (blocks == blocks[0]).all():
            return self._block(int(blocks[0]))[ticks - blocks[0] * self.ticks_per_block]
        return np.stack(
            [self._block(int(b))[int(t - b * self.ticks_per_block)] for t, b in zip(ticks, blocks)]
        )


def synthesize_batch(
    load: GpuLoad,
    tick_ts: np.ndarray,
    positions: np.ndarray,
    noise: np.ndarray,
    inference_factor: np.ndarray,
    xid: np.ndarray,
) -> dict[str, np.ndarray]:
    """Numeric sample columns for ticks `tick_ts` (unix s) x GPUs `positions`, tick-major.
    `noise` is (K, all GPUs, 3); `xid` holds XID counts reported at the first tick."""
    k, p = len(tick_ts), len(positions)
    z = noise[:, positions, :].astype(np.float64)
    busy = load.busy[positions]
    base = load.train[positions][None, :] + load.infer[positions][None, :] * inference_factor[:, None]
    sm = np.where(busy[None, :], np.clip(base + SM_NOISE_PCT * z[:, :, 0], 0.0, 100.0), 0.0)
    mem_used = load.mem_used[positions][None, :] * (1.0 + 0.01 * z[:, :, 1] * busy[None, :])
    mem_total = load.mem_total[positions]
    tdp, idle = load.tdp[positions], load.idle_w[positions]
    power = idle + (tdp - idle) * sm / 100.0 + POWER_NOISE_SHARE * tdp * z[:, :, 2]
    temp = AMBIENT_C + 0.45 * sm + 0.15 * load.slot[positions] + TEMP_NOISE_C * z[:, :, 1]
    xid_rows = np.zeros((k, p), dtype=np.int32)
    xid_rows[0] = xid[positions]
    return {
        "ts": np.repeat(tick_ts.astype(np.int64), p),
        "position": np.tile(positions, k),
        "sm_util_pct": np.round(sm, 2).ravel(),
        "mem_used_mib": np.round(np.clip(mem_used, 0.0, mem_total[None, :]), 1).ravel(),
        "mem_total_mib": np.tile(mem_total, k),
        "power_w": np.round(np.maximum(power, 0.8 * idle), 1).ravel(),
        "temp_c": np.round(temp, 1).ravel(),
        "codes": np.tile(load.codes[positions], (k, 1)),
        "xid_errors": xid_rows.ravel(),
    }


def samples_frame(load: GpuLoad, batches: list[dict[str, np.ndarray]]) -> pl.DataFrame:
    """One canonical-schema frame from numeric batches (strings resolved once, by gather)."""
    if not batches:
        return pl.DataFrame(schema=SAMPLE_SCHEMA)
    cols = {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
    position = pl.Series(cols["position"])
    labels = pl.Series(load.labels, dtype=pl.Utf8)
    codes = cols["codes"]
    return pl.DataFrame(
        {
            "ts": pl.Series(cols["ts"] * 1_000_000, dtype=pl.Int64).cast(pl.Datetime("us", "UTC")),
            "node_id": load.node_ids.gather(position),
            "gpu_uuid": load.uuids.gather(position),
            "gpu_index": pl.Series(load.gpu_index[cols["position"]], dtype=pl.Int32),
            "sm_util_pct": cols["sm_util_pct"],
            "mem_used_mib": cols["mem_used_mib"],
            "mem_total_mib": cols["mem_total_mib"],
            "power_w": cols["power_w"],
            "temp_c": cols["temp_c"],
            "mig_profile": labels.gather(pl.Series(codes[:, 2])),
            "task_id": labels.gather(pl.Series(codes[:, 0])),
            "tenant_id": labels.gather(pl.Series(codes[:, 1])),
            "xid_errors": pl.Series(cols["xid_errors"], dtype=pl.Int32),
        },
        schema=SAMPLE_SCHEMA,
    )
