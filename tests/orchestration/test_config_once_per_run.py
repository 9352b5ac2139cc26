"""The fleet resource parses the config once per run and hands the same typed config to every
asset and check of that run; the next run parses it again (an edited file takes effect at the
next run, never halfway through one)."""

from __future__ import annotations

import dagster as dg
import pytest

import assets.lib.resources as resources
from assets.lib.resources import FleetAdapterResource
from market_pipeline.config import MarketPipelineConfig


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Each load_config call the resource makes, by the path it was given."""
    calls: list[str | None] = []
    real = resources.load_config

    def counting(path: str | None = None) -> MarketPipelineConfig:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(resources, "load_config", counting)
    return calls


def _run_of_three_readers(
    seen: list[MarketPipelineConfig],
) -> list[dg.AssetsDefinition | dg.AssetChecksDefinition]:
    @dg.asset
    def first(fleet: FleetAdapterResource) -> None:
        seen.append(fleet.config())

    @dg.asset(deps=[first])
    def second(fleet: FleetAdapterResource) -> None:
        seen.append(fleet.config())
        seen.append(fleet.config())

    @dg.asset_check(asset=second)
    def second_check(fleet: FleetAdapterResource) -> dg.AssetCheckResult:
        seen.append(fleet.config())
        return dg.AssetCheckResult(passed=True)

    return [first, second, second_check]


def test_one_run_parses_the_config_once_and_every_step_reads_that_one(parses: list[str | None]) -> None:
    seen: list[MarketPipelineConfig] = []
    definitions = _run_of_three_readers(seen)
    result = dg.materialize(definitions, resources={"fleet": FleetAdapterResource()})
    assert result.success
    assert len(seen) == 4 and all(isinstance(c, MarketPipelineConfig) for c in seen)
    assert len(parses) == 1
    assert all(c is seen[0] for c in seen)


def test_each_run_parses_it_again(parses: list[str | None]) -> None:
    seen: list[MarketPipelineConfig] = []
    definitions = _run_of_three_readers(seen)
    fleet = FleetAdapterResource()
    assert dg.materialize(definitions, resources={"fleet": fleet}).success
    assert dg.materialize(definitions, resources={"fleet": fleet}).success
    assert len(parses) == 2 and len(seen) == 8
