"""Shared fixtures: an isolated project home per test session, and the traces folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real public traces; tests that need them skip when they are absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _no_config_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's MP__* / MARKET_PIPELINE_CONFIG must not leak into tests."""
    for name in list(os.environ):
        if name.startswith("MP__") or name == "MARKET_PIPELINE_CONFIG":
            monkeypatch.delenv(name, raising=False)


# Property tests draw the same examples on every run: CI must not turn red by chance.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("repeatable", derandomize=True, deadline=None)
_hypothesis_settings.load_profile("repeatable")
