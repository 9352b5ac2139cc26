"""Real backends name GPUs as the driver does; pools are priced by configured model names."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from telemetry_fake_pynvml import FakeGpu, FakeNvml  # noqa: E402

from market_pipeline.config import DEFAULT_CONFIG_PATH, load_config  # noqa: E402
from market_pipeline.hardware.dcgm.adapter import DcgmAdapter  # noqa: E402
from market_pipeline.hardware.naming import DeviceModelNamer, ModelAlias  # noqa: E402
from market_pipeline.hardware.nvml.adapter import NvmlAdapter  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm_metrics.txt"
NAMER = DeviceModelNamer(
    [
        ModelAlias("A100-80GB"),
        ModelAlias("A100-40GB"),
        ModelAlias("H800"),
        ModelAlias("A10"),
        ModelAlias("L40S", ("NVIDIA L40S PCIe 48GB",)),
    ]
)


@pytest.mark.parametrize(
    "device,model",
    [
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA H800", "H800"),
        ("NVIDIA A10", "A10"),  # not A100: tokens, not substrings
        ("nvidia l40s pcie 48gb", "L40S"),  # the configured alias, case-insensitive
        ("A100-80GB", "A100-80GB"),
        ("NVIDIA H200", "NVIDIA H200"),  # nothing configured: reported as is, priced by no pool
    ],
)
def test_device_names_resolve_to_configured_models(device, model):
    assert NAMER(device) == model


def test_ambiguous_device_name_is_not_guessed():
    namer = DeviceModelNamer([ModelAlias("A100-SXM4"), ModelAlias("A100-80GB")])
    assert namer("NVIDIA A100-SXM4-80GB") == "NVIDIA A100-SXM4-80GB"


def test_nvml_backend_from_config_lands_in_a_configured_pool(monkeypatch):
    config = load_config(DEFAULT_CONFIG_PATH, environ={"MP__ADAPTER__ZONE": "cn-beijing-b"})
    adapter = NvmlAdapter.from_config(config)
    adapter._nvml = FakeNvml([FakeGpu("GPU-aaa", name="NVIDIA H800"), FakeGpu("GPU-bbb", name="NVIDIA H800")])
    adapter._clock = lambda: datetime(2024, 6, 1, tzinfo=timezone.utc)
    (node,) = adapter.list_nodes()
    assert (node.gpu_model, node.zone, node.pool_id) == ("H800", "cn-beijing-b", "H800@cn-beijing-b")
    assert node.pool_id in config.pool_by_id
    assert {g.gpu_model for g in adapter.list_gpus()} == {"H800"}


def test_dcgm_backend_maps_model_names_too():
    # the fixture's modelName is "NVIDIA H100 80GB HBM3"
    namer = DeviceModelNamer([ModelAlias("H100-80GB"), ModelAlias("H100-94GB")])
    adapter = DcgmAdapter([str(FIXTURE)], zone="cn-hangzhou-a", model_namer=namer)
    (node,) = adapter.list_nodes()
    assert (node.gpu_model, node.pool_id) == ("H100-80GB", "H100-80GB@cn-hangzhou-a")
    assert {g.gpu_model for g in adapter.list_gpus()} == {"H100-80GB"}
    assert {t.pool_id for t in adapter.list_tasks()} == {"H100-80GB@cn-hangzhou-a"}


def test_inventory_counts_gpus_no_configured_pool_prices():
    from market_pipeline.fleet.inventory import unpriced_nodes
    from market_pipeline.hardware.protocol import NodeInfo, NodeState

    nodes = [
        NodeInfo(
            node_id="a",
            pool_id="H800@cn-beijing-b",
            gpu_model="H800",
            zone="cn-beijing-b",
            gpus=8,
            state=NodeState.ON,
        ),
        NodeInfo(
            node_id="b",
            pool_id="NVIDIA H200@local",
            gpu_model="NVIDIA H200",
            zone="local",
            gpus=8,
            state=NodeState.ON,
        ),
        NodeInfo(
            node_id="c",
            pool_id="NVIDIA H200@local",
            gpu_model="NVIDIA H200",
            zone="local",
            gpus=4,
            state=NodeState.ON,
        ),
    ]
    assert unpriced_nodes(nodes, {"H800@cn-beijing-b"}) == {"NVIDIA H200@local": 12}


def test_a_product_name_no_configured_model_takes_lands_on_its_catalog_model():
    config = load_config(DEFAULT_CONFIG_PATH, environ={})
    namer = DeviceModelNamer.from_config(config)
    assert namer("NVIDIA H200") == "H200"
    assert namer("NVIDIA GeForce RTX 4090") == "RTX-4090"
    assert namer("NVIDIA H800") == "H800"  # the configured model still wins
    assert namer("NVIDIA Quantum X9") == "NVIDIA Quantum X9"  # unknown: reported as is
