"""How the `local-process` backend starts the shipped toy worker (its command-line options)."""

from __future__ import annotations

from dataclasses import dataclass

WORKER_MODULE = "market_pipeline.workers.toy_trainer"


@dataclass(frozen=True)
class WorkerOptions:
    """How a launched toy worker behaves (the fault behaviours are for tests)."""

    util_pct: float = 60.0
    step_seconds: float = 0.05
    metrics_seconds: float = 1.0
    checkpoint_seconds: float = 0.0
    ignore_sigterm: bool = False
    crash_on: str = "none"  # none | checkpoint | warning

    def argv(self) -> list[str]:
        args = [
            "--util-pct",
            str(self.util_pct),
            "--step-seconds",
            str(self.step_seconds),
            "--metrics-seconds",
            str(self.metrics_seconds),
            "--checkpoint-seconds",
            str(self.checkpoint_seconds),
            "--crash-on",
            self.crash_on,
        ]
        return args + (["--ignore-sigterm"] if self.ignore_sigterm else [])
