"""The decision checks in Dagster: registered on their assets, and a failed blocking check
keeps what depends on its asset from running (a solver defect never reaches the price book);
an expected outcome (a fallback to the prices in force) warns and lets it run."""

from __future__ import annotations

from datetime import datetime, timezone

import dagster as dg
import polars as pl
import pytest

from assets.lib.resources import FleetAdapterResource, WarehouseResource
from assets.market.checks import FORECAST_COVERAGE, FORECAST_FALLBACK, equilibrium_checks
from market_pipeline.tick.live import TICK_SCHEMA
from market_pipeline.warehouse import open_warehouse

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def test_every_decision_asset_has_its_checks_and_the_blocking_ones_block() -> None:
    from sensors.definitions import decision_checks, defs

    checks = {
        (k.asset_key.to_user_string(), k.name)
        for a in defs.assets
        if isinstance(a, dg.AssetsDefinition)
        for k in a.check_keys
    }
    checks |= {(k.asset_key.to_user_string(), k.name) for c in defs.asset_checks for k in c.check_keys}
    for asset in ("equilibrium_prices", "price_book", "scaling_plan", "drain_requests", "demand_forecast"):
        assert any(a == asset for a, _ in checks), asset
    assert {("demand_forecast", FORECAST_COVERAGE), ("demand_forecast", FORECAST_FALLBACK)} <= checks
    blocking = {spec.key.name for c in decision_checks for spec in c.check_specs if spec.blocking}
    assert blocking == {
        "equilibrium_solve_certified",
        "price_book_promises",
        "scaling_plan_margins",
        "drain_requests_within_limits",
    }


def solve_and_tick(store, status: str, kkt: float) -> None:
    store.append(
        "solve_reports",
        pl.DataFrame(
            [
                {
                    "solve_id": "solve-1",
                    "solved_at": T0,
                    "status": status,
                    "converged": status == "converged",
                    "profit": 1.0,
                    "kkt_residual": kkt,
                    "iterations": 3,
                    "seconds": 0.1,
                    "fallback_reason": "leader step diverged" if status == "fallback" else None,
                    "shadow": False,
                    "report": "{}",
                }
            ],
            schema_overrides={"solved_at": pl.Datetime("us", "UTC"), "fallback_reason": pl.Utf8},
        ),
    )
    row = {
        name: (0.0 if dtype == pl.Float64 else False if dtype == pl.Boolean else "")
        for name, dtype in TICK_SCHEMA.items()
    }
    row.update(
        tick_at=T0,
        solve_id="solve-1",
        pool_id="p",
        status=status,
        margin=1.0,
        serving_gpus=8.0,
        capacity_target_gpus=8.0,
    )
    store.append("market_ticks", pl.DataFrame([row], schema=TICK_SCHEMA))


def run(tmp_path, status: str, kkt: float) -> dg.ExecuteInProcessResult:
    path = str(tmp_path / "w.duckdb")

    @dg.asset(name="equilibrium_prices")
    def stand_in(warehouse: WarehouseResource) -> None:  # what a tick stored, without the solver
        solve_and_tick(warehouse.get(), status, kkt)

    @dg.asset(name="price_book", deps=[stand_in])
    def downstream() -> None:
        pass

    return dg.materialize(
        [stand_in, downstream, equilibrium_checks],
        resources={"warehouse": WarehouseResource(path=path), "fleet": FleetAdapterResource()},
        raise_on_error=False,
    )


def test_a_fallback_solve_warns_and_the_price_book_keeps_the_prices_in_force(tmp_path) -> None:
    """A fallback with its reason is an expected outcome: the check warns, the run is green and
    the price book runs (it publishes the tick's prices: those in force)."""
    open_warehouse(tmp_path / "w.duckdb")
    result = run(tmp_path, "fallback", 0.0)
    assert result.success
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    certified = evaluations["equilibrium_solve_certified"]
    assert not certified.passed and certified.severity == dg.AssetCheckSeverity.WARN
    assert "leader step diverged" in certified.description
    assert evaluations["equilibrium_margins"].passed
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "price_book" in materialized


def test_a_solver_defect_fails_its_check_and_stops_the_price_book(tmp_path) -> None:
    """A solve that says converged with a residual over tolerance is a defect: it fails loudly."""
    open_warehouse(tmp_path / "w.duckdb")
    result = run(tmp_path, "converged", 1e-3)
    assert not result.success
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    certified = evaluations["equilibrium_solve_certified"]
    assert not certified.passed and certified.severity == dg.AssetCheckSeverity.ERROR
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "price_book" not in materialized


def test_a_certified_solve_lets_the_price_book_run(tmp_path) -> None:
    open_warehouse(tmp_path / "w.duckdb")
    result = run(tmp_path, "converged", 1e-9)
    assert result.success
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "price_book" in materialized
    (evaluation,) = [
        e for e in result.get_asset_check_evaluations() if e.check_name == "equilibrium_solve_certified"
    ]
    assert evaluation.metadata["kkt_residual"].value == 1e-9


def test_the_price_book_records_its_tick_latency(tmp_path) -> None:
    """The real price_book, after a stored tick: the tick's market_ticks rows carry the wall
    seconds from the run's start to its prices (what /metrics reports as tick latency)."""
    from assets.market.assets import price_book
    from market_pipeline.hardware.protocol import adapter_now

    path = tmp_path / "w.duckdb"
    store = open_warehouse(path)
    tick_at = adapter_now(FleetAdapterResource().get()).replace(microsecond=0)

    @dg.asset(name="equilibrium_prices")
    def stand_in(warehouse: WarehouseResource) -> None:
        solve_and_tick(warehouse.get(), "converged", 1e-9)
        with warehouse.get().connect() as con:  # the tick at the fleet's moment
            con.execute("UPDATE market_ticks SET tick_at = ?", [tick_at])

    result = dg.materialize(
        [stand_in, price_book],
        resources={"warehouse": WarehouseResource(path=str(path)), "fleet": FleetAdapterResource()},
    )
    assert result.success
    (event,) = [
        e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == "price_book"
    ]
    seconds = event.materialization.metadata["tick_seconds"].value
    assert 0 < seconds < 300
    stored = store.query("SELECT tick_seconds FROM market_ticks")["tick_seconds"].to_list()
    assert stored == [pytest.approx(seconds, abs=1e-3)]
