"""The `dcgm` backend: reads dcgm-exporter's /metrics exposition from URLs or files.

Read-only by nature: it observes GPUs, MIG instances and the pods dcgm-exporter attributes
to them, but cannot signal a task, cordon or power a node (those return UNSUPPORTED).
`adapter.dcgm_endpoint` is one source or several separated by commas; each is an http(s)
URL or a file path. An unreachable or malformed source is an outcome (`probe()`, and
`last_error` after a read), never an exception past the adapter.

Time: a scrape is a point-in-time reading. Samples carry the exposition's timestamps if it
has them, else the scrape time (for a file, its modification time); `read_samples(start,
end)` returns the current scrape's samples that fall in [start, end).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from market_pipeline.bounded_input import MAX_TEXT_BYTES, InputFileError, read_limited, read_text_bounded
from market_pipeline.hardware.dcgm.exposition import (
    FB_USED,
    NVLINK_BANDWIDTH,
    ExpositionError,
    Scrape,
    parse_exposition,
    scrape_samples,
)
from market_pipeline.hardware.naming import DeviceModelNamer, identity_namer, mig_gpu_milli
from market_pipeline.hardware.protocol import (
    GpuInfo,
    NodeInfo,
    Outcome,
    OutcomeStatus,
    TaskInfo,
    empty_samples,
)
from market_pipeline.hardware.readonly import ReadOnlyAdapter

if TYPE_CHECKING:
    from market_pipeline.config import MarketPipelineConfig

DEFAULT_ZONE = "dcgm"


class DcgmSourceError(ValueError):
    """A dcgm-exporter source that cannot be read; the message names it."""


class DcgmAdapter(ReadOnlyAdapter):
    backend = "dcgm"
    cannot_act_because = "dcgm-exporter only observes (read-only)"

    def __init__(
        self,
        sources: Sequence[str],
        timeout_seconds: float = 10.0,
        zone: str = DEFAULT_ZONE,
        clock: Callable[[], datetime] | None = None,
        model_namer: Callable[[str], str] = identity_namer,
    ) -> None:
        super().__init__(clock)
        self._model_name = model_namer
        if not sources:
            raise DcgmSourceError("dcgm backend needs adapter.dcgm_endpoint (a URL or file)")
        self.sources = tuple(sources)
        self.timeout_seconds = timeout_seconds
        self.zone = zone
        self.last_error: str | None = None

    @classmethod
    def from_config(cls, config: MarketPipelineConfig) -> "DcgmAdapter":
        adapter = getattr(config, "adapter")
        sources = [s.strip() for s in str(adapter.dcgm_endpoint).split(",") if s.strip()]
        return cls(
            sources,
            timeout_seconds=float(adapter.operation_timeout_seconds),
            zone=adapter.zone,
            model_namer=DeviceModelNamer.from_config(config),
        )

    # -- reading -----------------------------------------------------------------------
    def scrape(self) -> list[Scrape]:
        """Every source once; raises DcgmSourceError / ExpositionError naming the source."""
        return [self._scrape_one(source) for source in self.sources]

    def _scrape_one(self, source: str) -> Scrape:
        if source.startswith(("http://", "https://")):
            try:
                with urllib.request.urlopen(source, timeout=self.timeout_seconds) as response:
                    text = read_limited(response, MAX_TEXT_BYTES, f"dcgm endpoint {source}").decode("utf-8")
            except (urllib.error.URLError, OSError, UnicodeDecodeError, InputFileError) as exc:
                raise DcgmSourceError(f"cannot scrape {source}: {exc}") from exc
            return parse_exposition(text, self.now(), source)
        path = Path(source)
        try:
            text = read_text_bounded(path, "dcgm exposition file")
            scraped_at = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
        except (OSError, UnicodeDecodeError, InputFileError) as exc:
            raise DcgmSourceError(f"cannot read dcgm exposition file {source}: {exc}") from exc
        return parse_exposition(text, scraped_at, source)

    def _scrapes(self) -> list[Scrape]:
        try:
            scrapes = self.scrape()
        except (DcgmSourceError, ExpositionError) as exc:
            self.last_error = str(exc)
            return []
        self.last_error = None
        return scrapes

    def probe(self) -> Outcome:
        try:
            scrapes = self.scrape()
        except (DcgmSourceError, ExpositionError) as exc:
            return Outcome(OutcomeStatus.FAILED, str(exc))
        gpus = sum(len(s.parents) for s in scrapes)
        if gpus == 0:
            return Outcome(OutcomeStatus.NO_DEVICE, "dcgm-exporter reports no GPU")
        return Outcome.success(f"{gpus} GPU(s) from {len(scrapes)} source(s)")

    def list_nodes(self) -> list[NodeInfo]:
        nodes: dict[str, list] = {}
        for scrape in self._scrapes():
            for gpu in scrape.parents:
                nodes.setdefault(gpu.hostname, []).append(gpu)
        return [
            self._node(
                host,
                self._model_name(gpus[0].model),
                len(gpus),
                any(g.fields.get(NVLINK_BANDWIDTH, 0.0) > 0 for g in gpus),
            )
            for host, gpus in sorted(nodes.items())
        ]

    def list_gpus(self) -> list[GpuInfo]:
        result = []
        for scrape in self._scrapes():
            for entity in scrape.entities:
                total = entity.mem_total_mib()
                result.append(
                    GpuInfo(
                        gpu_uuid=entity.uuid,
                        node_id=entity.hostname,
                        gpu_index=entity.gpu_index,
                        gpu_model=self._model_name(entity.model),
                        memory_total_mib=int(total or 0),
                        mig_profile=entity.mig_profile,
                    )
                )
        return result

    def read_samples(self, start: datetime, end: datetime) -> pl.DataFrame:
        frames = [scrape_samples(scrape) for scrape in self._scrapes()]
        if not frames:
            return empty_samples()
        samples = pl.concat(frames)
        return samples.filter((pl.col("ts") >= start) & (pl.col("ts") < end))

    def list_tasks(self) -> list[TaskInfo]:
        """Pods dcgm-exporter attributes to GPUs. Kind, QoS and priority are not observable
        here: tasks carry neutral defaults and `do_not_drain` (this backend cannot drain)."""
        tasks: dict[str, dict] = {}
        for scrape in self._scrapes():
            for entity in scrape.entities:
                for namespace, pod in sorted(entity.pods):
                    task = tasks.setdefault(
                        f"{namespace}/{pod}",
                        {
                            "tenant": namespace,
                            "node": entity.hostname,
                            "model": self._model_name(entity.model),
                            "gpus": [],
                            "milli": 1000,
                            "mem": 0.0,
                            "mig": entity.mig_profile,
                            "seen": scrape.scraped_at,
                        },
                    )
                    task["gpus"].append(entity.uuid)
                    task["milli"] = min(task["milli"], mig_gpu_milli(entity.mig_profile))
                    task["mem"] += entity.fields.get(FB_USED, 0.0)
        return [
            self._task(
                task_id,
                t["tenant"],
                t["model"],
                t["node"],
                tuple(t["gpus"]),
                t["milli"],
                t["seen"],
                int(t["mem"]),
                t["mig"],
                do_not_drain=True,
            )
            for task_id, t in sorted(tasks.items())
        ]

    def verify_released(self, gpu_uuids: Sequence[str], task_id: str | None = None) -> Outcome:
        """OK when no pod is attributed to any of the GPUs (or their MIG instances) now."""
        try:
            scrapes = self.scrape()
        except (DcgmSourceError, ExpositionError) as exc:
            return Outcome(OutcomeStatus.FAILED, str(exc))
        wanted = set(gpu_uuids)
        seen: set[str] = set()
        busy: list[str] = []
        for scrape in scrapes:
            for entity in scrape.entities:
                if entity.uuid in wanted or entity.parent_uuid in wanted:
                    seen.add(entity.uuid if entity.uuid in wanted else entity.parent_uuid)
                    busy += [f"{entity.uuid} by {ns}/{pod}" for ns, pod in sorted(entity.pods)]
        missing = sorted(wanted - seen)
        if busy:
            return Outcome(OutcomeStatus.FAILED, "still in use: " + "; ".join(busy))
        if missing:
            return Outcome(OutcomeStatus.GONE, "not reported by dcgm-exporter: " + ", ".join(missing))
        return Outcome.success(f"{len(wanted)} GPU(s) released")
