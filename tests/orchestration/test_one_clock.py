"""One clock in what the operator reads (issue #42): under the simulated daemon's clock, an
asset check's execution carries the simulated time, as the materialisation it checks does
(Dagster stamps a check execution's row with the database's wall clock unless told)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import dagster as dg

from assets.harness.sim_daemon import SimulatedClock

SIMULATED = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)  # years before the wall clock


@dg.asset
def priced() -> int:
    return 1


@dg.asset_check(asset=priced)
def priced_is_positive() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)


def _times(instance: dg.DagsterInstance) -> tuple[float, float]:
    materialisation = instance.get_latest_materialization_event(dg.AssetKey("priced"))
    assert materialisation is not None
    key = dg.AssetCheckKey(dg.AssetKey("priced"), "priced_is_positive")
    (execution,) = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
    return materialisation.timestamp, execution.create_timestamp


def test_a_check_execution_carries_the_simulated_clock_of_its_materialisation(tmp_path):
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        with SimulatedClock(SIMULATED).installed():
            result = dg.materialize([priced, priced_is_positive], instance=instance)
        assert result.success
        materialised, checked = _times(instance)
        window = (SIMULATED.timestamp(), (SIMULATED + timedelta(minutes=10)).timestamp())
        assert window[0] <= materialised <= window[1]
        assert window[0] <= checked <= window[1]
        assert abs(checked - materialised) < 60


def test_outside_the_simulated_clock_a_check_keeps_the_wall_clock(tmp_path):
    """The patch is the simulated clock's only: once it is left, Dagster stamps as before
    (and the live loop, on the wall clock, never installs it)."""
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        with SimulatedClock(SIMULATED).installed():
            pass
        assert dg.materialize([priced, priced_is_positive], instance=instance).success
        materialised, checked = _times(instance)
        now = datetime.now(timezone.utc).timestamp()
        assert abs(materialised - now) < 600 and abs(checked - now) < 600
