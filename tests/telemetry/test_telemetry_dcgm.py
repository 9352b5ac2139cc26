"""The dcgm backend on a dcgm-exporter exposition: file, URL, MIG, pods, failures."""

from __future__ import annotations

import http.server
import os
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from market_pipeline.hardware.dcgm.adapter import DcgmAdapter, DcgmSourceError
from market_pipeline.hardware.dcgm.exposition import ExpositionError, parse_exposition
from market_pipeline.hardware.protocol import NodeAdapter, OutcomeStatus

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm_metrics.txt"
MIG_PARENT = "GPU-c5d94e1b-6a27-4f80-8e13-2b7a9c0d4e56"
SCRAPED = datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc)


def test_telemetry_dcgm_fixture_maps_to_the_canonical_fields() -> None:
    scrape = parse_exposition(FIXTURE.read_text(), SCRAPED)
    by_uuid = {e.uuid: e for e in scrape.entities}
    assert len(scrape.parents) == 4 and len(scrape.entities) == 5
    whole = by_uuid["GPU-3f1c2a9e-7d41-4b0a-9c55-0e6f1b2d8a10"]
    assert whole.sm_util_pct() == 97.0
    assert whole.mem_total_mib() == 76210 + 4812 + 537
    assert whole.task() == ("acme-research", "llm-pretrain-0")
    instance = by_uuid[f"{MIG_PARENT}/1"]
    assert instance.mig_profile == "3g.40gb"
    assert instance.sm_util_pct() == pytest.approx(41.2208)  # GR_ENGINE_ACTIVE x 100
    assert instance.fields["DCGM_FI_DEV_POWER_USAGE"] == 233.9  # the parent's reading
    assert MIG_PARENT not in by_uuid  # the MIG-enabled parent is not sampled twice


def test_telemetry_dcgm_adapter_reads_a_file_source() -> None:
    adapter = DcgmAdapter([str(FIXTURE)])
    assert isinstance(adapter, NodeAdapter)
    assert adapter.probe().ok
    nodes = adapter.list_nodes()
    assert [(n.node_id, n.gpus, n.nvlink) for n in nodes] == [("gpu-node-07", 4, True)]
    mtime = datetime.fromtimestamp(os.stat(FIXTURE).st_mtime, tz=timezone.utc)
    samples = adapter.read_samples(mtime - timedelta(minutes=1), mtime + timedelta(minutes=1))
    assert samples.height == 5 and samples.get_column("ts").unique().to_list() == [mtime]
    assert samples.filter(samples["task_id"].is_not_null()).get_column("tenant_id").sort().to_list() == [
        "acme-research",
        "blue-inference",
        "cobalt-labs",
    ]
    assert adapter.read_samples(mtime + timedelta(hours=1), mtime + timedelta(hours=2)).is_empty()
    tasks = {t.task_id: t for t in adapter.list_tasks()}
    assert tasks["cobalt-labs/embed-batch-2"].gpu_milli == 428
    assert all(t.do_not_drain for t in tasks.values())


def test_telemetry_dcgm_adapter_scrapes_a_url() -> None:
    body = FIXTURE.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        adapter = DcgmAdapter([url], clock=lambda: SCRAPED)
        samples = adapter.read_samples(SCRAPED, SCRAPED + timedelta(seconds=1))
        assert samples.height == 5 and adapter.last_error is None
    finally:
        server.shutdown()
        server.server_close()


def test_telemetry_dcgm_unreachable_source_is_an_outcome_not_a_crash(tmp_path: Path) -> None:
    adapter = DcgmAdapter(["http://127.0.0.1:9/metrics"], timeout_seconds=1)
    outcome = adapter.probe()
    assert outcome.status is OutcomeStatus.FAILED and "127.0.0.1:9" in outcome.detail
    assert adapter.list_nodes() == [] and "127.0.0.1:9" in adapter.last_error
    missing = DcgmAdapter([str(tmp_path / "gone.txt")])
    assert missing.read_samples(SCRAPED, SCRAPED).is_empty()
    assert "gone.txt" in missing.last_error


def test_telemetry_dcgm_write_operations_are_unsupported() -> None:
    adapter = DcgmAdapter([str(FIXTURE)])
    for outcome in (
        adapter.warn_task("x", 1),
        adapter.terminate_task("x", 1),
        adapter.kill_task("x"),
        adapter.cordon("n"),
        adapter.power_off("n"),
    ):
        assert outcome.status is OutcomeStatus.UNSUPPORTED
        assert outcome.detail.startswith("dcgm backend cannot ") and "read-only" in outcome.detail
    assert adapter.read_task_events(adapter.now(), adapter.now()).is_empty()
    assert adapter.verify_released(["GPU-1e7f0d3c-9b58-4a21-a6d0-5c8e2f3b7a94"]).ok
    busy = adapter.verify_released([MIG_PARENT])
    assert busy.status is OutcomeStatus.FAILED and "embed-batch-2" in busy.detail


@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "no DCGM_FI_"),
        ('DCGM_FI_DEV_GPU_UTIL{UUID="GPU-1"} 5\n', r"lacks label\(s\) gpu"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="zero",UUID="GPU-1"} 5\n', "non-integer gpu"),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} five\n', "not a valid Prometheus"),
    ],
)
def test_telemetry_dcgm_bad_exposition_names_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ExpositionError, match=problem):
        parse_exposition(text, SCRAPED, source="scrape.txt")


def test_telemetry_dcgm_needs_an_endpoint() -> None:
    with pytest.raises(DcgmSourceError, match="dcgm_endpoint"):
        DcgmAdapter([])


def test_telemetry_dcgm_is_built_from_the_config() -> None:
    from market_pipeline.config import load_config
    from market_pipeline.hardware import make_adapter

    config = load_config(
        environ={"MP__ADAPTER__BACKEND": "dcgm", "MP__ADAPTER__DCGM_ENDPOINT": f"{FIXTURE}, {FIXTURE}"}
    )
    adapter = make_adapter(config)
    assert isinstance(adapter, DcgmAdapter) and adapter.sources == (str(FIXTURE),) * 2
    with pytest.raises(DcgmSourceError):
        make_adapter(load_config(environ={"MP__ADAPTER__BACKEND": "dcgm"}))
