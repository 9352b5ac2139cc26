"""Pools, prices and tenants come from the fleet for any node list; an unpriced model is a
startup error naming it and the key to add."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from market_pipeline.config import DEFAULT_CONFIG_PATH, ConfigError, load_config
from market_pipeline.gpus.catalog import load_gpu_catalog
from market_pipeline.gpus.models import known_spec

TRACE_MODELS = (
    "T4",
    "P100",
    "V100M16",
    "V100M32",
    "G1",
    "G2",
    "G3",
    "A10",
    "A100-SXM4-80GB",
    "A800-SXM4-80GB",
    "H800",
    "GPU-series-1",
    "GPU-series-2",
)


def node_list(tmp_path: Path, rows: list[tuple[str, int, str]]) -> Path:
    path = tmp_path / "nodes.csv"
    pl.DataFrame(
        {
            "sn": [r[0] for r in rows],
            "cpu_milli": [64000] * len(rows),
            "memory_mib": [262144] * len(rows),
            "gpu": [r[1] for r in rows],
            "model": [r[2] for r in rows],
        }
    ).write_csv(path)
    return path


def fleet_config(path: Path, **extra: str):
    return load_config(DEFAULT_CONFIG_PATH, environ={"MP__ADAPTER__FLEET_SOURCE": str(path), **extra})


def test_the_catalog_prices_every_model_of_the_shipped_traces_and_says_why() -> None:
    catalog = load_gpu_catalog()
    for model in TRACE_MODELS:
        entry = catalog.lookup(model)
        assert entry is not None, model
        assert 0 < entry.cost_per_gpu_hour < entry.list_price_per_gpu_hour and entry.source
    for model in ("G1", "G2", "G3", "GPU-series-1", "GPU-series-2"):
        assert "undisclosed" in catalog.lookup(model).assumption


def test_the_catalog_holds_each_models_power_envelope_and_the_twin_reads_it_by_any_spelling() -> None:
    catalog = load_gpu_catalog()
    for entry in catalog.entries:
        assert 0 < entry.idle_w < entry.tdp_w, entry.name
        if entry.source.startswith("tdp: "):  # the price rule quotes the same TDP the twin draws
            assert entry.source == f"tdp: {entry.tdp_w:g} W", entry.name
    h200 = known_spec("NVIDIA H200")  # an alias, as NVML names it
    assert (h200.memory_mib, h200.tdp_w, h200.idle_w, h200.nvlink_domain) == (144384, 700.0, 75.0, 8)
    assert known_spec("V100M16").nvlink_domain == 4 and known_spec("GB200").nvlink_domain == 72
    assert known_spec("T4").nvlink_domain == 1
    unknown = known_spec("Unnamed-Accelerator")  # not in the catalog: a mid-range card's envelope
    assert (unknown.memory_mib, unknown.tdp_w, unknown.nvlink) == (32768, 300.0, False)


def test_pools_come_from_the_node_list(tmp_path: Path) -> None:
    path = node_list(tmp_path, [("n0", 8, "V100M32"), ("n1", 4, "V100M32"), ("n2", 2, "T4"), ("n3", 0, "")])
    config = fleet_config(path)
    zone = config.zones[0].name
    assert sorted(config.pool_by_id) == [f"T4@{zone}", f"V100M32@{zone}"]
    v100 = config.pool_by_id[f"V100M32@{zone}"]
    assert (v100.nodes, v100.max_nodes, v100.gpus_per_node) == (2, 2, 8)
    assert v100.base_price == load_gpu_catalog().lookup("V100M32").list_price_per_gpu_hour
    assert v100.price_min < v100.base_price < v100.price_max
    assert config.gpu_model_by_name["T4"].source.startswith("catalog")
    # no configured tenant claims these models: tenants come from the workload (QoS x size)
    assert config.tenants and all(t.id.split("-")[-1] in ("single", "multi") for t in config.tenants)
    assert {m for t in config.tenants for m in t.claims} == {"T4", "V100M32"}
    assert {t.kind for t in config.tenants} == {"elastic", "rigid"}
    assert all(t.drain_tolerant == (t.kind == "elastic") for t in config.tenants)


def test_configured_tenants_stay_when_they_claim_the_fleet(tmp_path: Path) -> None:
    path = node_list(tmp_path, [("n0", 1, "A10"), ("n1", 1, "A10")])
    config = fleet_config(path)
    assert [t.id for t in config.tenants] == [
        t.id for t in load_config(DEFAULT_CONFIG_PATH, environ={}).tenants
    ]
    derived = fleet_config(path, MP__ADAPTER__TENANTS_SOURCE="workload")
    assert all(t.id.endswith(("-single", "-multi")) for t in derived.tenants)


def test_an_unpriced_model_is_a_startup_error_naming_it_and_the_key(tmp_path: Path) -> None:
    path = node_list(tmp_path, [("n0", 8, "V100M32"), ("n1", 8, "B300")])
    with pytest.raises(ConfigError) as caught:
        fleet_config(path)
    message = str(caught.value)
    assert "'B300'" in message and "[[gpu_models]]" in message and "\n" not in message


def test_the_real_openb_and_spot_lists_are_fully_priced(shared_data: Path) -> None:
    for path in (
        shared_data / "alibaba-gpu-2023" / "openb_node_list_gpu_node.csv",
        shared_data / "alibaba-spot-2026" / "node_info_df.csv",
    ):
        config = fleet_config(path)
        gpus = sum(p.nodes * p.gpus_per_node for p in config.pools)
        assert len(config.pools) >= 6 and gpus > 0
        assert all(p.gpu_model in config.gpu_model_by_name for p in config.pools)


# Product names as NVML / dcgm-exporter report them, and the catalog model each must price as.
NVML_NAMES = {
    "NVIDIA H200": "H200",
    "NVIDIA H100 80GB HBM3": "H100",
    "NVIDIA A100-SXM4-80GB": "A100-80GB",
    "NVIDIA GeForce RTX 4090": "RTX-4090",
    "NVIDIA L40S": "L40S",
    "NVIDIA B200": "B200",
    "NVIDIA GB200": "GB200",
    "NVIDIA H20": "H20",
    "NVIDIA L4": "L4",
    "NVIDIA A10": "A10",
    "Tesla T4": "T4",
    "Tesla V100-SXM2-32GB": "V100M32",
    "Tesla V100-SXM2-16GB": "V100M16",
    "Tesla P100-PCIE-16GB": "P100",
    "NVIDIA H800": "H800",
    "NVIDIA A800-SXM4-80GB": "A800-SXM4-80GB",
}


def test_current_models_are_priced_from_a_named_source() -> None:
    catalog = load_gpu_catalog()
    for model in ("H200", "B200", "GB200", "H20", "L40S", "L4", "RTX-4090"):
        entry = catalog.lookup(model)
        assert entry is not None, model
        assert 0 < entry.cost_per_gpu_hour < entry.list_price_per_gpu_hour
        # a market figure names its page and date; the one rule-priced model says why
        assert ("2026" in entry.source) or (entry.source.startswith("tdp") and entry.assumption), entry.source
    # the newer generation is dearer than the one it replaces, per GPU-hour
    price = {m: catalog.lookup(m).list_price_per_gpu_hour for m in ("H100", "H200", "B200", "L4", "L40S")}
    assert price["H100"] < price["H200"] < price["B200"] and price["L4"] < price["L40S"]


@pytest.mark.parametrize(("product", "model"), sorted(NVML_NAMES.items()))
def test_nvml_product_names_look_up_their_model(product: str, model: str) -> None:
    catalog = load_gpu_catalog()
    assert catalog.lookup(product).name == model
    assert catalog.lookup(f"  {product.lower()} ").name == model


def test_a_node_list_of_nvml_product_names_prices_every_pool(tmp_path: Path) -> None:
    rows = [(f"n{i}", 8, product) for i, product in enumerate(NVML_NAMES)]
    config = fleet_config(node_list(tmp_path, rows))
    zone = config.zones[0].name
    # A100 is configured under "A100-80GB"; every other product lands on its catalog model
    assert sorted(p.gpu_model for p in config.pools) == sorted(set(NVML_NAMES.values()))
    h200 = config.pool_by_id[f"H200@{zone}"]
    assert h200.base_price == load_gpu_catalog().lookup("H200").list_price_per_gpu_hour
    assert config.gpu_model_by_name["A100-80GB"].source == "config"


def test_an_unknown_product_name_is_still_a_startup_error_naming_it(tmp_path: Path) -> None:
    path = node_list(tmp_path, [("n0", 8, "NVIDIA H200"), ("n1", 8, "NVIDIA Quantum X9")])
    with pytest.raises(ConfigError, match="'NVIDIA Quantum X9'"):
        fleet_config(path)
