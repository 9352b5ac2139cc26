"""Operator metadata: tables with a schema, no `nan` or `None` in a cell, lineage declared."""

from __future__ import annotations

import json

import dagster as dg
import polars as pl

from assets.lib.metadata import table_metadata
from assets.scaling.assets import decision_table


def test_tables_carry_a_schema_and_show_missing_values_empty() -> None:
    table = table_metadata(
        [
            {"pool": "p", "margin": float("nan"), "n": 3, "reasons": None},
            {"pool": "q", "margin": 1.23456, "n": None, "reasons": "x"},
        ]
    )
    assert [(c.name, c.type) for c in table.schema.columns] == [
        ("pool", "string"),
        ("margin", "float"),
        ("n", "int"),
        ("reasons", "string"),
    ]
    assert [r.data for r in table.records] == [
        {"pool": "p", "margin": "", "n": 3, "reasons": ""},
        {"pool": "q", "margin": 1.2346, "n": "", "reasons": "x"},
    ]


def test_a_hold_shows_no_node_rather_than_nan() -> None:
    rows = pl.DataFrame(
        [
            {
                "pool_id": "p",
                "target": None,
                "action": "hold",
                "allowed": True,
                "reasons": ["in service 4 nodes = target 4"],
                "inputs": json.dumps({"count": 1}),
            },
            {
                "pool_id": "p",
                "target": "n1",
                "action": "cordon",
                "allowed": True,
                "reasons": ["a", "b"],
                "inputs": json.dumps({"count": 1}),
            },
        ]
    )
    records = [r.data for r in table_metadata(decision_table(rows)).records]
    assert records[0]["node"] == "" and records[1] == {
        "pool_id": "p",
        "action": "cordon",
        "node": "n1",
        "allowed": True,
        "count": 1,
        "reasons": "a; b",
    }


def test_lineage_is_complete() -> None:
    from sensors.definitions import defs

    graph = defs.get_repository_def().asset_graph

    def parents(name: str) -> set[str]:
        return {k.to_user_string() for k in graph.get(dg.AssetKey(name)).parent_keys}

    assert "drain_requests" in {
        k.to_user_string() for k in graph.get(dg.AssetKey("telemetry_samples")).child_keys
    }
    assert "usage_intervals" in parents("demand_history")
    assert parents("usage_intervals") == {"fleet_adapter"}
    assert "fleet_adapter" in parents("telemetry_samples") and "fleet_adapter" in parents("fleet_inventory")
