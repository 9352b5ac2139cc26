"""Runs as Kubernetes Jobs (`market_pipeline/defaults/dagster.k8s.yaml`, docs/kubernetes.md).

No Kubernetes API server runs here. The second test loads a Dagster instance from the shipped
file (its storage in a fresh PostgreSQL database), whose dagster-k8s `K8sRunLauncher` then
launches a run of `control_loop_job`; the launcher's client talks to a recorder on 127.0.0.1 that
answers `POST .../jobs` as an API server would and keeps the body. The test reads the Job from
that body, in the API's own JSON: what a cluster would receive, not what it would do with it.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster._cli.api import ExecuteRunArgs
from dagster._config import process_config
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.instance.config import dagster_instance_config_schema
from dagster._core.launcher import LaunchRunContext
from dagster._serdes import deserialize_value
from dagster_k8s import K8sRunLauncher
from dagster_k8s.job import get_job_name_from_run_id

from market_pipeline.config import load_config

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S_YAML = REPO_ROOT / "market_pipeline" / "defaults" / "dagster.k8s.yaml"
CREDENTIALS = "market-pipeline-credentials"


def test_the_k8s_instance_file_is_valid_for_dagster_and_for_the_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DAGSTER_PG_URL", "postgresql+psycopg2://mp@db1:5432/mp_cluster_dagster")
    data = yaml.safe_load(K8S_YAML.read_text())
    checked = process_config(dagster_instance_config_schema(), data)
    assert checked.success, [e.message for e in checked.errors or []]
    launcher = data["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    # the launcher's own schema: a misspelt key or a wrong type fails here, not in the daemon
    own = process_config(K8sRunLauncher.config_type(), launcher["config"])
    assert own.success, [e.message for e in own.errors or []]
    assert "concurrency" not in data  # no one-writer pool on the cluster profile


class _ApiRecorder(BaseHTTPRequestHandler):
    """Answers a Job's creation as the API server does (201, the object back) and keeps it."""

    protocol_version = "HTTP/1.1"
    received: list[tuple[str, str, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).received.append(("POST", self.path, body))
        answer = json.dumps(body).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        del format, args


@pytest.fixture()
def api_recorder(tmp_path: Path) -> Iterator[tuple[Path, list[tuple[str, str, dict[str, Any]]]]]:
    """A kubeconfig naming the recorder, and the requests it received."""
    handler = type("Recorder", (_ApiRecorder,), {"received": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "recorder", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                ],
                "users": [{"name": "runs", "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": "recorder", "context": {"cluster": "recorder", "user": "runs"}}],
                "current-context": "recorder",
            }
        )
    )
    try:
        yield kubeconfig, handler.received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _env_names_read_by(data: object) -> set[str]:
    """Every `{env: NAME}` an instance file resolves from its process's environment."""
    if isinstance(data, dict):
        own = {data["env"]} if set(data) == {"env"} and isinstance(data["env"], str) else set()
        return own.union(*(_env_names_read_by(value) for value in data.values()))
    if isinstance(data, list):
        return set().union(*(_env_names_read_by(value) for value in data))
    return set()


def _cluster_env_names() -> set[str]:
    """The settings `make cluster-up` gives every process of the cluster profile (CLUSTER_ENV)."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    block = re.search(r"^export CLUSTER_ENV := (.*?)(?<!\\)\n", makefile, re.M | re.S)
    assert block is not None, "the Makefile has no CLUSTER_ENV"
    return set(re.findall(r"\b(MP__\w+|DAGSTER_PG_URL)=", block.group(1)))


@pytest.mark.postgres
def test_a_run_launched_by_the_k8s_instance_sends_the_job_the_cluster_profile_needs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    control_url: str,
    api_recorder: tuple[Path, list[tuple[str, str, dict[str, Any]]]],
) -> None:
    kubeconfig, received = api_recorder
    shipped = yaml.safe_load(K8S_YAML.read_text())
    config = shipped["run_launcher"]["config"]
    # The only change to the shipped file: the API server is the recorder, not the pod's own
    # cluster (in-cluster service-account config).
    instance_file = json.loads(json.dumps(shipped))
    instance_file["run_launcher"]["config"].update(
        {"load_incluster_config": False, "kubeconfig_file": str(kubeconfig)}
    )
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_file))
    database = dict(part.split("=", 1) for part in control_url.split())["dbname"]
    storage_url = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}"
    monkeypatch.setenv("DAGSTER_PG_URL", storage_url)
    monkeypatch.delenv("DAGSTER_CURRENT_IMAGE", raising=False)

    # the run as the daemon's queue hands it over: its code is workspace.yaml's location
    origin = (
        ReconstructableRepository.for_file(
            str(REPO_ROOT / "sensors" / "definitions.py"), "defs", working_directory=str(REPO_ROOT)
        )
        .get_reconstructable_job("control_loop_job")
        .get_python_origin()
    )
    with dg.DagsterInstance.from_config(str(home)) as instance:
        launcher = instance.run_launcher
        assert isinstance(launcher, K8sRunLauncher)
        run = instance.add_run(
            dg.DagsterRun(
                job_name="control_loop_job",
                run_id=str(uuid.uuid4()),
                job_code_origin=origin,
                status=dg.DagsterRunStatus.NOT_STARTED,
            )
        )
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
        image_tag = instance.get_run_by_id(run.run_id).tags.get("dagster/image")

    ((method, path, job),) = received
    assert (method, path) == ("POST", f"/apis/batch/v1/namespaces/{config['job_namespace']}/jobs")
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert job["metadata"]["name"] == get_job_name_from_run_id(run.run_id)
    run_k8s = config["run_k8s_config"]
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["ttlSecondsAfterFinished"] == run_k8s["job_spec_config"]["ttl_seconds_after_finished"]

    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"market-pipeline/role": "control"}
    assert pod["serviceAccountName"] == config["service_account_name"]
    (container,) = pod["containers"]
    assert container["image"] == config["job_image"] == image_tag
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"cpu": "4", "memory": "16Gi"},
    }

    # The command: `dagster api execute_run` of this run, its code and its instance, the
    # instance by reference: the storage URL is read from the pod's environment, never carried
    # in the Job (whose spec any reader of the namespace sees).
    assert container["args"][:3] == ["dagster", "api", "execute_run"]
    args = deserialize_value(container["args"][3], ExecuteRunArgs)
    assert args.run_id == run.run_id
    assert args.job_origin.job_name == "control_loop_job"
    pointer = args.job_origin.repository_origin.code_pointer
    assert Path(pointer.python_file) == REPO_ROOT / "sensors" / "definitions.py"
    assert pointer.fn_name == "defs"
    storage = args.instance_ref.storage_data
    assert (storage.module_name, storage.class_name) == ("assets.lib.pg_storage", "PooledPostgresStorage")
    assert yaml.safe_load(storage.config_yaml) == {"postgres_url": {"env": "DAGSTER_PG_URL"}}
    assert database not in json.dumps(job)

    # The pod's instance is that reference, this file's (dagster-k8s 0.29.27 does not mount
    # `instance_config_map` in a run's pod; the webserver and the daemon mount it), resolved in
    # the pod, whose DAGSTER_HOME is set.
    ref = args.instance_ref
    assert ref.run_launcher_data.class_name == "K8sRunLauncher"
    assert ref.run_coordinator_data.class_name == "QueuedRunCoordinator"
    assert not [v for v in pod.get("volumes") or [] if "configMap" in v]
    env = {item["name"]: item for item in container["env"]}
    assert env["DAGSTER_HOME"]["value"]

    # The environment: every variable the instance file reads, and every setting `make
    # cluster-up` gives the profile's processes; credentials each from its key of the Secret.
    needed = _env_names_read_by(shipped) | _cluster_env_names()
    assert "DAGSTER_PG_URL" in needed and "MP__ORCHESTRATION__CELERY_BROKER" in needed
    assert needed <= set(env), sorted(needed - set(env))
    secrets = {n: e["valueFrom"]["secretKeyRef"] for n, e in env.items() if "valueFrom" in e}
    assert {n: (ref["name"], ref["key"]) for n, ref in secrets.items()} == {
        name: (CREDENTIALS, name)
        for name in (
            "DAGSTER_PG_URL",
            "MP__WAREHOUSE__CATALOG_URL",
            "MP__WAREHOUSE__DATA_PATH",
            "MP__ORCHESTRATION__CELERY_BROKER",
        )
    }
    assert container["envFrom"] == [{"secretRef": {"name": "market-pipeline-object-store"}}]
    assert env["DAGSTER_RUN_JOB_NAME"]["value"] == "control_loop_job"
    # ... which the pod's process reads as the cluster profile
    pod_environ = {n: e["value"] for n, e in env.items() if "value" in e}
    pod_environ |= {name: f"secret:{name}" for name in secrets}
    profile = load_config(environ=pod_environ, resolve_fleet=False)
    assert profile.warehouse.backend == "ducklake"
    assert profile.warehouse.catalog_url == "secret:MP__WAREHOUSE__CATALOG_URL"
    assert profile.warehouse.data_path == "secret:MP__WAREHOUSE__DATA_PATH"
    assert profile.control.backend == "postgres"
    assert profile.adapter.state_store == "control"
    assert profile.orchestration.executor == "celery"
    assert profile.orchestration.celery_broker == "secret:MP__ORCHESTRATION__CELERY_BROKER"

    # Labels, on the Job and on its pod: the run's, dagster's and the file's.
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert labels["dagster/job"] == "control_loop_job"
        assert labels["dagster/run-id"] == run.run_id
        assert labels["app.kubernetes.io/component"] == "run_worker"
        assert labels["market-pipeline/profile"] == "cluster"
