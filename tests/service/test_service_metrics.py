"""/metrics: the exposition's numbers against the warehouse; a real Prometheus scrapes it and
`promtool check rules` accepts the shipped alerting rules; the dashboard names real metrics."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from service_harness.kit import A100, call

import market_pipeline.service as service_package

MONITORING = Path(service_package.__file__).with_name("monitoring")
RULES = 11  # alerts.yml: 9 on the service's families, 2 on dcgm-exporter's
DCGM_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm_metrics.txt"


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
    # last snapshot: 2 guaranteed GPUs wait, drainable work holds 1: half the premium is backed
    assert samples[("mp_guarantee_reach", (("pool", A100),))] == pytest.approx(0.5)
    # the latest tick's latency, and the p95 of those recorded (two: 30 s, then 12.5 s)
    assert samples[("mp_tick_latency_seconds", ())] == 12.5
    assert samples[("mp_tick_latency_p95_seconds", ())] == 30.0


def test_promtool_accepts_the_alert_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    result = subprocess.run(
        [promtool, "check", "rules", str(MONITORING / "alerts.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {RULES} rules found" in result.stdout
    config = subprocess.run(
        [promtool, "check", "config", str(MONITORING / "prometheus.yml")], capture_output=True, text=True
    )
    assert config.returncode == 0, config.stdout + config.stderr


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


class FakeDcgmExporter:
    """dcgm-exporter's /metrics on 127.0.0.1, serving a recorded exposition (tests only)."""

    def __init__(self, text: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args) -> None:  # noqa: ANN002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.target = f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(expr)}"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


def test_a_real_prometheus_scrapes_the_service_and_the_dcgm_exporter(served, tmp_path):
    """The shipped prometheus.yml (its targets pointed at this test's servers): both jobs up,
    the service's prices and dcgm-exporter's GPU series stored, the exporter's other series
    dropped by the shipped relabelling, and the shipped rules loaded."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus (Debian package prometheus) is not installed")
    server, _ = served
    dcgm = FakeDcgmExporter(DCGM_FIXTURE.read_bytes())
    shutil.copy(MONITORING / "alerts.yml", tmp_path / "alerts.yml")
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    targets = {"market-pipeline": server.base.removeprefix("http://"), "dcgm": dcgm.target}
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        job.pop("scrape_interval", None)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
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
    price = f'mp_price_per_gpu_hour{{pool="{A100}",resource_class="guaranteed"}}'
    try:
        deadline, value, gpus = time.monotonic() + 60, None, []
        while time.monotonic() < deadline:
            try:
                result = _query(port, price)
                gpus = _query(port, "DCGM_FI_DEV_GPU_UTIL")
                if result and gpus:
                    value = float(result[0]["value"][1])
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert value == 3.0
        fixture = DCGM_FIXTURE.read_text()
        expected = {
            line.split('UUID="')[1].split('"')[0]
            for line in fixture.splitlines()
            if line.startswith("DCGM_FI_DEV_GPU_UTIL{")
        }
        assert {g["metric"]["UUID"] for g in gpus} == expected
        assert _query(port, "DCGM_FI_DEV_SM_CLOCK") == []  # not kept by the relabelling
        # the watermark the alert and the dashboard compute, per GPU (and per MIG instance)
        watermark = _query(port, "100 * DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)")
        framebuffers = sum(1 for line in fixture.splitlines() if line.startswith("DCGM_FI_DEV_FB_USED{"))
        assert len(watermark) == framebuffers and all(0 <= float(w["value"][1]) <= 100 for w in watermark)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5) as r:
            active = json.loads(r.read())["data"]["activeTargets"]
        assert sorted((t["labels"]["job"], t["health"]) for t in active) == [
            ("dcgm", "up"),
            ("market-pipeline", "up"),
        ]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5) as r:
            groups = json.loads(r.read())["data"]["groups"]
        assert sum(len(g["rules"]) for g in groups) == RULES
    finally:
        process.terminate()
        process.wait(timeout=20)
        dcgm.stop()
