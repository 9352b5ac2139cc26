"""Fixtures the Slurm tests share: each module starts its own local cluster (`cluster`, sized
for what it tests); the adapter on it is the same."""

from __future__ import annotations

import pytest

from market_pipeline.config import load_config
from market_pipeline.hardware.slurm.adapter import SlurmAdapter
from market_pipeline.hardware.slurm.cluster import LocalCluster


@pytest.fixture
def adapter(cluster: LocalCluster) -> SlurmAdapter:
    """The slurm backend on the module's local cluster, polling every 0.1 s."""
    return SlurmAdapter.for_cluster(cluster, load_config(), poll_seconds=0.1)
