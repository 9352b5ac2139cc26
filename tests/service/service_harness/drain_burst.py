"""Run N real drains (DrainExecutor, the warehouse audit store as the loop uses it: a short
connection per drain) against the scripted fleet double, on the wall clock. Run as its
own process, the way the loop's drain job writes the warehouse beside the service:

    python tests/service/service_harness/drain_burst.py WAREHOUSE N GAP_SECONDS TENANT [TENANT...]

Prints one JSON line: drains run and seconds taken."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "drain"))

from drain_testkit import FakeFleetAdapter, make_task, node  # noqa: E402

from market_pipeline.drain.calls import InlineStepCaller  # noqa: E402
from market_pipeline.drain.executor import DrainExecutor, DrainRequest  # noqa: E402
from market_pipeline.drain.protocol import DrainState  # noqa: E402
from market_pipeline.drain.steps import DrainTiming  # noqa: E402
from market_pipeline.drain.store import WarehouseAuditStore  # noqa: E402
from market_pipeline.warehouse import Warehouse  # noqa: E402

TIMING = DrainTiming(
    warn_seconds=0.05,
    checkpoint_timeout_seconds=0.1,
    terminate_timeout_seconds=0.1,
    max_total_seconds=30,
    kill_timeout_seconds=0.1,
    verify_timeout_seconds=0.1,
    call_margin_seconds=1,
    poll_seconds=0.01,
)


class WallClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.timezone.utc)

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


def main(path: str, count: int, gap: float, tenants: list[str]) -> None:
    clock = WallClock()
    started = time.monotonic()
    warehouse = Warehouse(Path(path))
    for i in range(count):
        task = make_task(
            f"burst-{i}",
            tenant=tenants[i % len(tenants)],
            node=f"n{i % 4}",
            started_at=clock.now() - dt.timedelta(hours=1),
        )
        adapter = FakeFleetAdapter(clock, [(task, "exits_during_notice")], [node(f"n{i % 4}")])  # type: ignore[arg-type]
        with warehouse.connect() as con:  # one connection per drain, as `market-pipeline drain` holds one
            store = WarehouseAuditStore(warehouse, connection=con)
            executor = DrainExecutor(adapter, store, TIMING, clock=clock, caller=InlineStepCaller(clock))
            request = DrainRequest(
                f"burst-drain-{i}", task, reasons=("under_used: burst",), decision_id=f"dec-{i}"
            )
            report = executor.run(request)
        # a burst is of whole drains: one cut short would surface in a webhook test as a missing
        # notice, far from its cause, so the burst fails here, naming the drain
        assert report.final_state is DrainState.REPORTED, (
            request.drain_id,
            report.final_state,
            report.reason,
        )
        time.sleep(gap)  # the next drain comes later: readers get the file in between
    print(json.dumps({"drains": count, "seconds": round(time.monotonic() - started, 3)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:])
