"""The time partitions begin where the fleet's history begins."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from market_pipeline.config import load_config
from market_pipeline.fleet.history import HISTORY_START_ENV, history_start
from market_pipeline.fleet.setup import default_epoch


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(tmp_path))
    monkeypatch.delenv(HISTORY_START_ENV, raising=False)
    return tmp_path


def test_before_the_twin_exists_history_begins_at_the_epoch_it_will_get(home):
    assert history_start(load_config()) == datetime.fromtimestamp(default_epoch(), UTC)


def test_history_begins_at_the_stored_twins_epoch_not_at_today(home, monkeypatch):
    from market_pipeline.hardware import make_adapter

    monkeypatch.setenv("MP__ADAPTER__SIM_EPOCH", "2026-10-01T00:00:00Z")
    make_adapter(load_config()).now()  # creates the twin with that epoch
    monkeypatch.delenv("MP__ADAPTER__SIM_EPOCH")
    # the config no longer names the epoch: the state file still does
    assert history_start(load_config()) == datetime(2026, 10, 1, tzinfo=UTC)


def test_a_pinned_start_wins_and_a_bad_one_is_named(home, monkeypatch):
    monkeypatch.setenv(HISTORY_START_ENV, "2025-06-01T07:30:00Z")
    assert history_start(load_config()) == datetime(2025, 6, 1, 7, tzinfo=UTC)
    monkeypatch.setenv(HISTORY_START_ENV, "June")
    with pytest.raises(ValueError, match=HISTORY_START_ENV):
        history_start(load_config())
