"""/metrics: the exposition's numbers against the warehouse; a real Prometheus scrapes it and
`promtool check rules` accepts the shipped alerting rules; the dashboard names real metrics."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_testkit import A100, call

import market_pipeline.service as service_package

MONITORING = Path(service_package.__file__).with_name("monitoring")


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_carry_the_warehouse_numbers(served):
    server, _ = served
    status, text, headers = call(server.base, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    samples = _samples(text)
    assert samples[("mp_price_per_gpu_hour", (("pool", A100), ("resource_class", "guaranteed")))] == 3.0
    # the latest of the kit's ticks: margin 0.5 - 0.1 * 5 = 0.0 for every pool
    assert samples[("mp_certificate_margin", (("pool", A100),))] == pytest.approx(0.0)
    assert samples[("mp_promise_breaches", (("pool", A100), ("promise", "drainable_band")))] == 0.0
    # drain decisions by outcome and reason: one failed drain of acme
    failed = [
        v
        for (n, labels), v in samples.items()
        if n == "mp_decisions_total" and ("outcome", "failed") in labels
    ]
    assert failed == [1.0]
    names = {n for n, _ in samples}
    assert {"mp_pool_gpu_utilisation", "mp_solve_status"} - names == {
        "mp_solve_status"
    }  # no solve in the kit
    assert samples[("mp_pool_gpu_utilisation", (("pool", A100),))] == pytest.approx(4 / 8)  # last snapshot


def test_promtool_accepts_the_alert_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    result = subprocess.run(
        [promtool, "check", "rules", str(MONITORING / "alerts.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 8 rules found" in result.stdout


def test_dashboard_queries_name_exported_metrics():
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    kinds = {p["type"] for p in dashboard["panels"]}
    assert "heatmap" in kinds
    heat = next(p for p in dashboard["panels"] if p["type"] == "heatmap")
    assert "mp_gpu_sm_util_pct" in heat["targets"][0]["expr"] and "by (gpu)" in heat["targets"][0]["expr"]
    assert any("mp_gpu_memory_used_pct" in t["expr"] for p in dashboard["panels"] for t in p["targets"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_real_prometheus_scrapes_the_service(served, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus (Debian package prometheus) is not installed")
    server, _ = served
    target = server.base.removeprefix("http://")
    shutil.copy(MONITORING / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [alerts.yml]\n"
        f"scrape_configs:\n  - job_name: mp\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = _free_port()
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, value = time.monotonic() + 60, None
        query = urllib.parse.quote(f'mp_price_per_gpu_hour{{pool="{A100}",resource_class="guaranteed"}}')
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/api/v1/query?query={query}", timeout=5
                ) as r:
                    result = json.loads(r.read())["data"]["result"]
                if result:
                    value = float(result[0]["value"][1])
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert value == 3.0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5) as r:
            targets = json.loads(r.read())["data"]["activeTargets"]
        assert [t["health"] for t in targets] == ["up"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5) as r:
            groups = json.loads(r.read())["data"]["groups"]
        assert sum(len(g["rules"]) for g in groups) == 8
    finally:
        process.terminate()
        process.wait(timeout=20)
