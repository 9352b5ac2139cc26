"""What the operator reads about dbt in Dagster: model and test descriptions, row counts."""

from __future__ import annotations

from market_pipeline.billing.dbt_metadata import dbt_test_description, model_description, row_counts
from market_pipeline.warehouse import open_warehouse


def test_models_read_their_description_not_their_sql() -> None:
    props = {
        "name": "fct_x",
        "resource_type": "model",
        "description": "  Lines per tenant. ",
        "raw_code": "select 1",
    }
    assert model_description(props) == "Lines per tenant."
    assert model_description({**props, "description": ""}) == "dbt model fct_x"


def test_generic_tests_read_as_sentences() -> None:
    def generic(name, **kwargs):
        return {
            "name": "t",
            "attached_node": "model.market_pipeline.fct_x",
            "column_name": "c",
            "test_metadata": {"name": name, "kwargs": {"column_name": "c", **kwargs}},
        }

    assert dbt_test_description(generic("not_null")) == "fct_x.c is never null."
    assert dbt_test_description(generic("unique")) == "fct_x.c is unique: no value appears twice."
    assert (
        dbt_test_description(generic("accepted_values", arguments={"values": ["hour", "day"]}))
        == "fct_x.c only takes the values hour, day."
    )
    assert (
        dbt_test_description(generic("relationships", arguments={"to": "ref('stg_y')", "field": "id"}))
        == "every fct_x.c exists in stg_y.id."
    )
    assert (
        dbt_test_description({**generic("not_null"), "description": "Written by hand."}) == "Written by hand."
    )


def test_singular_tests_read_their_leading_comment() -> None:
    sql = (
        "{{ config(meta={'dagster': {'ref': {'name': 'focus_export'}}}) }}\n"
        "-- Reconciliation: the export and the invoice agree,\n-- hour by hour.\nselect 1\n-- not this\n"
    )
    assert (
        dbt_test_description({"name": "assert_x", "raw_code": sql})
        == "Reconciliation: the export and the invoice agree, hour by hour."
    )
    assert dbt_test_description({"name": "assert_y", "raw_code": "select 1"}) == "dbt test assert_y"


def test_row_counts_of_existing_relations_only(tmp_path) -> None:
    store = open_warehouse(tmp_path / "w.duckdb")
    store.execute("CREATE TABLE fct_demo AS SELECT * FROM range(7)")
    counts = row_counts(store, ["fct_demo", "missing_model", "bad name; drop table fct_demo"])
    assert counts == {"fct_demo": 7}
    assert store.query("SELECT count(*) AS n FROM fct_demo")["n"][0] == 7  # the odd name ran nothing
