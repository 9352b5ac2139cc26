"""Fleet catalog: from the config's pools and from real node lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from market_pipeline.config import load_config
from market_pipeline.fleet.catalog import (
    FleetSourceError,
    catalog_from_node_csv,
    catalog_from_pools,
    gpu_uuid,
    zone_slug,
)
from market_pipeline.hardware.protocol import NodeState


def test_fleet_pools_give_on_warm_and_off_nodes_with_readable_ids() -> None:
    config = load_config()
    catalog = catalog_from_pools(config)
    a100 = [n for n in catalog.nodes if n.pool_id == "A100-80GB@cn-hangzhou-a"]
    assert [n.node_id for n in a100][:2] == ["a100-hz-a-00", "a100-hz-a-01"]
    states = [n.initial_state for n in a100]
    assert states.count(NodeState.ON) == 6 and states.count(NodeState.WARM) == 1
    assert states.count(NodeState.OFF) == 3  # spare up to max_nodes
    assert all(n.gpus == 8 for n in a100)
    assert catalog.n_gpus == sum(n.gpus for n in catalog.nodes)


def test_fleet_gpu_uuids_are_stable_and_nvidia_shaped() -> None:
    first, again = gpu_uuid("a100-hz-a-00", 3), gpu_uuid("a100-hz-a-00", 3)
    assert first == again != gpu_uuid("a100-hz-a-00", 4)
    assert first.startswith("GPU-") and [len(p) for p in first[4:].split("-")] == [8, 4, 4, 4, 12]


def test_fleet_nvlink_peers_stay_inside_a_domain() -> None:
    catalog = catalog_from_pools(load_config())
    gpus = [g for g in catalog.gpu_infos() if g.node_id == "h800-bj-b-00"]
    assert len(gpus) == 8 and all(len(g.nvlink_peers) == 7 for g in gpus)
    a10 = [g for g in catalog.gpu_infos() if g.node_id == "a10-hz-a-00"]
    assert all(g.nvlink_peers == () for g in a10)


def test_fleet_zone_slug_abbreviates_known_cities() -> None:
    assert zone_slug("cn-hangzhou-a") == "hz-a"
    assert zone_slug("cn-beijing-b") == "bj-b"
    assert zone_slug("eu-central-1") == "central-1"


def test_fleet_openb_node_list_maps_models_to_pools(tmp_path: Path) -> None:
    csv = tmp_path / "nodes.csv"
    csv.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "n0,64000,262144,2,P100\n"
        "n1,96000,786432,8,V100M32\n"
        "n2,32000,65536,0,\n"
    )
    catalog = catalog_from_node_csv(csv, load_config())
    assert [n.pool_id for n in catalog.nodes] == [
        "P100@cn-hangzhou-a",
        "V100M32@cn-hangzhou-a",
        "none@cn-hangzhou-a",
    ]
    assert catalog.models["V100M32"].nvlink and catalog.models["V100M32"].nvlink_domain == 4
    cap = catalog.to_capacity()
    assert cap.total_gpus() == 10 and cap.cpu_total.tolist() == [64000, 96000, 32000]


def test_fleet_spot_node_list_uses_configured_model_names(tmp_path: Path) -> None:
    csv = tmp_path / "spot.csv"
    csv.write_text("gpu_model,gpu_capacity_num,cpu_num,node_name\nA100-SXM4-80GB,8,128,3\nA10,1,128,2\n")
    catalog = catalog_from_node_csv(csv, load_config(), zone="cn-beijing-b")
    assert [n.node_id for n in catalog.nodes] == ["spot-3", "spot-2"]
    assert catalog.nodes[0].gpu_model == "A100-80GB"  # alias of the configured model
    assert catalog.nodes[0].pool_id == "A100-80GB@cn-beijing-b"
    assert catalog.models["A100-80GB"].mig_profiles  # the config's spec, with MIG


def test_fleet_node_list_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(FleetSourceError, match="does not exist"):
        catalog_from_node_csv(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("sn,gpu,model\nn0,2,P100\n")
    with pytest.raises(FleetSourceError, match="missing.*cpu_milli"):
        catalog_from_node_csv(bad)
    text = tmp_path / "text.csv"
    text.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,two,P100\n")
    with pytest.raises(FleetSourceError, match="'gpu' must hold integers"):
        catalog_from_node_csv(text)
    dup = tmp_path / "dup.csv"
    dup.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,1,T4\nn0,1,1,1,T4\n")
    with pytest.raises(FleetSourceError, match="duplicate node ids"):
        catalog_from_node_csv(dup)


def test_fleet_real_openb_node_list(shared_data: Path) -> None:
    catalog = catalog_from_node_csv(shared_data / "alibaba-gpu-2023" / "openb_node_list_gpu_node.csv")
    assert len(catalog.nodes) == 1213 and catalog.n_gpus == 6212
