"""The documented K8sRunLauncher configuration (`market_pipeline/defaults/dagster.k8s.yaml`) is a
valid Dagster instance file that names an image, resources and a node selector. On paper only:
dagster-k8s is not a dependency and no Kubernetes API server runs here, so the Job it would
build is not constructed in this suite (docs/kubernetes.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config_schema

K8S_YAML = Path(__file__).resolve().parents[2] / "market_pipeline" / "defaults" / "dagster.k8s.yaml"


def test_the_k8s_instance_file_is_valid_and_names_image_resources_and_node_selector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DAGSTER_PG_URL", "postgresql+psycopg2://mp@db1:5432/mp_cluster_dagster")
    data = yaml.safe_load(K8S_YAML.read_text())
    checked = process_config(dagster_instance_config_schema(), data)
    assert checked.success, [e.message for e in checked.errors or []]
    launcher = data["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    config = launcher["config"]
    assert config["job_image"] and config["instance_config_map"] and config["job_namespace"]
    resources = config["run_k8s_config"]["container_config"]["resources"]
    assert set(resources) == {"requests", "limits"} and resources["limits"]["memory"]
    assert config["run_k8s_config"]["pod_spec_config"]["node_selector"]
    assert config["run_k8s_config"]["job_spec_config"]["backoff_limit"] == 0
    assert "concurrency" not in data  # no one-writer pool on the cluster profile
