"""Cluster profile tests (the `lake` fixture is the suite's, in tests/conftest.py). The billing
scenario (meter two hours, rate them with dbt) is shared with tests/billing."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "billing"))
