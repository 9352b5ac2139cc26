"""The fleet catalog: which nodes and GPUs exist, built from the config's pools or from a
real node list (openb `openb_node_list_*.csv`, Alibaba spot `node_info_df.csv`).

The catalog is static; what changes (power state, cordons, free capacity, tasks) lives in
the twin. Node ids from pools read like `a100-hz-a-00`; GPU UUIDs are derived from the node
id and index, so they are stable across runs and seeds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import polars as pl

from market_pipeline.bounded_input import InputFileError, checked_file
from market_pipeline.config.model import MarketPipelineConfig
from market_pipeline.gpus.catalog import load_gpu_catalog
from market_pipeline.gpus.models import GpuModelSpec, known_spec, spec_from_config
from market_pipeline.hardware.protocol import GpuInfo, NodeState
from market_pipeline.placement.capacity import ClusterCapacity

# Host resources of a config-pool node, per GPU (a typical 8-GPU server: 128 vCPU, 1 TiB).
CPU_MILLI_PER_GPU = 16_000
MEMORY_MIB_PER_GPU = 131_072
# The spot trace gives cores but no memory: assume 8 GiB per core.
MEMORY_MIB_PER_CORE = 8_192
DEFAULT_ZONE = "zone-a"

OPENB_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
SPOT_COLUMNS = ("gpu_model", "gpu_capacity_num", "cpu_num", "node_name")
_CITY_ABBREVIATIONS = {
    "hangzhou": "hz",
    "beijing": "bj",
    "shanghai": "sh",
    "shenzhen": "sz",
    "guangzhou": "gz",
    "zhangjiakou": "zjk",
    "ulanqab": "wlcb",
    "chengdu": "cd",
    "qingdao": "qd",
    "heyuan": "hy",
    "huhehaote": "hhht",
    "wulanchabu": "wlcb",
}


class FleetSourceError(ValueError):
    """The fleet source (config pools or node list) cannot be turned into a catalog."""


@dataclass(frozen=True)
class NodeSpec:
    node_id: str
    pool_id: str
    gpu_model: str
    zone: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    initial_state: NodeState = NodeState.ON


@dataclass(frozen=True)
class FleetCatalog:
    nodes: tuple[NodeSpec, ...]
    models: Mapping[str, GpuModelSpec]
    source: str
    _index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids = [n.node_id for n in self.nodes]
        dupes = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
        if dupes:
            raise FleetSourceError(f"fleet {self.source}: duplicate node ids {dupes[:5]}")
        missing = sorted({n.gpu_model for n in self.nodes} - set(self.models))
        if missing:
            raise FleetSourceError(f"fleet {self.source}: no GPU model spec for {missing}")
        self._index.update({node_id: i for i, node_id in enumerate(ids)})

    def node_row(self, node_id: str) -> int | None:
        return self._index.get(node_id)

    @cached_property
    def fingerprint(self) -> str:
        """Changes whenever the set of nodes, their models or sizes change."""
        text = "|".join(
            f"{n.node_id}:{n.gpu_model}:{n.zone}:{n.gpus}:{n.cpu_milli}:{n.memory_mib}" for n in self.nodes
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # -- per-GPU layout (catalog order: node by node, index by index) -------------------
    @cached_property
    def gpu_node_row(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.nodes)), [n.gpus for n in self.nodes])

    @cached_property
    def gpu_slot(self) -> np.ndarray:
        return np.concatenate([np.arange(n.gpus) for n in self.nodes] or [np.zeros(0, int)]).astype(np.int64)

    @cached_property
    def gpu_offsets(self) -> np.ndarray:
        """First catalog GPU position of each node."""
        return np.concatenate([[0], np.cumsum([n.gpus for n in self.nodes])])[:-1].astype(np.int64)

    @cached_property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(gpu_uuid(n.node_id, i) for n in self.nodes for i in range(n.gpus))

    @cached_property
    def gpu_position(self) -> dict[str, int]:
        return {uuid: i for i, uuid in enumerate(self.gpu_uuids)}

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_uuids)

    def gpu_infos(self) -> list[GpuInfo]:
        infos = []
        for row, node in enumerate(self.nodes):
            spec = self.models[node.gpu_model]
            base = int(self.gpu_offsets[row])
            uuids = self.gpu_uuids[base : base + node.gpus]
            for i in range(node.gpus):
                peers = (
                    tuple(
                        u
                        for j, u in enumerate(uuids)
                        if j != i and j // spec.nvlink_domain == i // spec.nvlink_domain
                    )
                    if spec.nvlink
                    else ()
                )
                infos.append(GpuInfo(uuids[i], node.node_id, i, node.gpu_model, spec.memory_mib, None, peers))
        return infos

    def to_capacity(self) -> ClusterCapacity:
        """A fresh capacity model; only nodes that start ON are schedulable."""
        models = [n.gpu_model for n in self.nodes]
        return ClusterCapacity.build(
            node_ids=[n.node_id for n in self.nodes],
            models=models,
            gpus=[n.gpus for n in self.nodes],
            cpu_milli=[n.cpu_milli for n in self.nodes],
            mem_mib=[n.memory_mib for n in self.nodes],
            mig_sizes_by_model={m: s.mig_slice_sizes for m, s in self.models.items()},
            nvlink_domain_by_model={m: s.nvlink_domain for m, s in self.models.items()},
            schedulable=[n.initial_state is NodeState.ON for n in self.nodes],
        )


def gpu_uuid(node_id: str, index: int) -> str:
    digest = hashlib.sha1(f"{node_id}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


# -- from the config's pools -------------------------------------------------------------
def _config_specs(config: MarketPipelineConfig) -> dict[str, GpuModelSpec]:
    return {
        m.name: spec_from_config(m.name, m.memory_mib, m.nvlink, m.mig_profiles) for m in config.gpu_models
    }


def zone_slug(zone: str) -> str:
    parts = zone.lower().split("-")
    if len(parts) >= 3 and len(parts[0]) == 2:  # drop a country/region prefix such as "cn"
        parts = parts[1:]
    return "-".join(_CITY_ABBREVIATIONS.get(p, p) for p in parts)


def _model_slug(model: str, full: bool) -> str:
    slug = "".join(c if c.isalnum() else "-" for c in model.lower()).strip("-")
    return slug if full else slug.split("-")[0]


def catalog_from_pools(config: MarketPipelineConfig) -> FleetCatalog:
    """Nodes per pool: `nodes` ON, then up to `warm_nodes` WARM, then OFF up to `max_nodes`."""
    prefixes: dict[str, str] = {}
    for pool in config.pools:
        prefix = f"{_model_slug(pool.gpu_model, False)}-{zone_slug(pool.zone)}"
        if prefix in prefixes.values():
            prefix = f"{_model_slug(pool.gpu_model, True)}-{zone_slug(pool.zone)}"
        if prefix in prefixes.values():
            raise FleetSourceError(f"pools: cannot give pool {pool.pool_id} a unique node-id prefix")
        prefixes[pool.pool_id] = prefix
    nodes = []
    for pool in config.pools:
        warm = min(pool.warm_nodes, pool.max_nodes - pool.nodes)
        width = max(2, len(str(max(pool.max_nodes - 1, 0))))
        for i in range(pool.max_nodes):
            state = (
                NodeState.ON if i < pool.nodes else NodeState.WARM if i < pool.nodes + warm else NodeState.OFF
            )
            nodes.append(
                NodeSpec(
                    node_id=f"{prefixes[pool.pool_id]}-{i:0{width}d}",
                    pool_id=pool.pool_id,
                    gpu_model=pool.gpu_model,
                    zone=pool.zone,
                    gpus=pool.gpus_per_node,
                    cpu_milli=pool.gpus_per_node * CPU_MILLI_PER_GPU,
                    memory_mib=pool.gpus_per_node * MEMORY_MIB_PER_GPU,
                    initial_state=state,
                )
            )
    return FleetCatalog(tuple(nodes), _config_specs(config), "config")


# -- from a node list ---------------------------------------------------------------------
def _read_node_csv(path: Path) -> pl.DataFrame:
    try:
        checked_file(path, "node list")
    except InputFileError as exc:
        raise FleetSourceError(str(exc)) from None
    try:
        return pl.read_csv(path, infer_schema_length=10_000)
    except FileNotFoundError:
        raise FleetSourceError(f"node list {path} does not exist") from None
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise FleetSourceError(f"node list {path} cannot be read as CSV: {exc}") from None


def _int_column(frame: pl.DataFrame, column: str, path: Path) -> list[int]:
    try:
        values = frame[column].cast(pl.Int64, strict=True)
    except pl.exceptions.PolarsError:
        raise FleetSourceError(f"node list {path}: column {column!r} must hold integers") from None
    if values.null_count():
        raise FleetSourceError(f"node list {path}: column {column!r} has {values.null_count()} empty cells")
    if (values < 0).any():
        raise FleetSourceError(f"node list {path}: column {column!r} has negative values")
    return values.to_list()


def resolve_model_name(
    name: str, configured: Mapping[str, GpuModelSpec], device_names: Mapping[str, str]
) -> str:
    """The model a node list's `model` cell names: a configured model (by name, or by one of
    its `device_names`, case-insensitive), else the shipped catalog's model that lists it by
    name or alias (NVML product names such as "NVIDIA H200" included; the configured spelling
    of that model wins when the config has one), else the cell as written (unpriced: the
    market refuses it at startup, naming it)."""
    if name in configured:
        return name
    by_device = device_names.get(" ".join(name.split()).casefold())
    if by_device is not None:
        return by_device
    entry = load_gpu_catalog().lookup(name)
    if entry is None:
        return name
    spellings = {s.casefold(): s for s in configured}
    for candidate in (entry.name, *entry.aliases):
        if candidate.casefold() in spellings:
            return spellings[candidate.casefold()]
    return entry.name


def catalog_from_node_csv(
    path: str | Path, config: MarketPipelineConfig | None = None, zone: str | None = None
) -> FleetCatalog:
    """Every row a node, all ON, in one zone (the given one, else the first configured).
    GPU models named in the config take its spec; others the built-in table's."""
    path = Path(path)
    frame = _read_node_csv(path)
    columns = set(frame.columns)
    zone = zone or (config.zones[0].name if config else DEFAULT_ZONE)
    configured = _config_specs(config) if config else {}
    device_names = (
        {" ".join(d.split()).casefold(): m.name for m in config.gpu_models for d in m.device_names}
        if config
        else {}
    )
    if set(OPENB_COLUMNS) <= columns:
        ids = frame["sn"].cast(pl.Utf8).to_list()
        models = frame["model"].cast(pl.Utf8).fill_null("").to_list()
        gpus = _int_column(frame, "gpu", path)
        cpu = _int_column(frame, "cpu_milli", path)
        memory = _int_column(frame, "memory_mib", path)
    elif set(SPOT_COLUMNS) <= columns:
        ids = [n if not n.isdigit() else f"spot-{n}" for n in frame["node_name"].cast(pl.Utf8).to_list()]
        models = frame["gpu_model"].cast(pl.Utf8).fill_null("").to_list()
        gpus = _int_column(frame, "gpu_capacity_num", path)
        cores = _int_column(frame, "cpu_num", path)
        cpu = [c * 1000 for c in cores]
        memory = [c * MEMORY_MIB_PER_CORE for c in cores]
    else:
        raise FleetSourceError(
            f"node list {path}: expected openb columns {list(OPENB_COLUMNS)} (missing "
            f"{sorted(set(OPENB_COLUMNS) - columns)}) or spot columns {list(SPOT_COLUMNS)} "
            f"(missing {sorted(set(SPOT_COLUMNS) - columns)})"
        )
    if any(not i for i in ids):
        raise FleetSourceError(f"node list {path}: a node has an empty name")
    if any(g and not m for g, m in zip(gpus, models)):
        raise FleetSourceError(f"node list {path}: a node with GPUs has no GPU model")
    resolved = {m: resolve_model_name(m, configured, device_names) for m in set(models)}
    names = [resolved[m] if g else "none" for m, g in zip(models, gpus)]
    specs = {name: configured.get(name) or known_spec(name) for name in set(names)}
    nodes = tuple(
        NodeSpec(i, f"{m}@{zone}", m, zone, g, c, mem, NodeState.ON)
        for i, m, g, c, mem in zip(ids, names, gpus, cpu, memory)
    )
    return FleetCatalog(nodes, specs, str(path))


def build_catalog(
    config: MarketPipelineConfig, source: str | None = None, zone: str | None = None
) -> FleetCatalog:
    """The catalog named by `source` (default `adapter.fleet_source`): "config" or a CSV path
    (relative paths resolve against MARKET_PIPELINE_HOME / the working directory)."""
    source = source or config.adapter.fleet_source
    if source == "config":
        return catalog_from_pools(config)
    return catalog_from_node_csv(config.resolve_path(source), config, zone)
