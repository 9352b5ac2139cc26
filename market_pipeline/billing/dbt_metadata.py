"""What an operator reads about the dbt billing project in Dagster: each model's own
description (not its raw SQL), a sentence for every dbt test, and each model's row count.

Descriptions come from the manifest: a model's `description:` (dbt/models/**.yml); a test's
own `description:` or `meta.description` where one is written, else, for a generic test, a
sentence made from its name and arguments, and for a singular test its leading SQL comment
(every test in dbt/tests opens with one that says what it asserts).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from market_pipeline.warehouse import Warehouse, billing_readers

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def model_description(props: Mapping[str, Any]) -> str:
    return (
        str(props.get("description") or "").strip()
        or f"dbt {props.get('resource_type', 'model')} {props.get('name', '')}"
    )


def dbt_test_description(props: Mapping[str, Any]) -> str:
    own = str(props.get("description") or (props.get("meta") or {}).get("description") or "").strip()
    if own:
        return own
    metadata = props.get("test_metadata") or {}
    if metadata:
        return _generic_sentence(
            str(metadata.get("name", "")),
            metadata.get("kwargs") or {},
            str(props.get("column_name") or (metadata.get("kwargs") or {}).get("column_name") or ""),
            _model_of(props),
        )
    return (
        _leading_comment(str(props.get("raw_code") or props.get("raw_sql") or ""))
        or f"dbt test {props.get('name')}"
    )


def _model_of(props: Mapping[str, Any]) -> str:
    attached = props.get("attached_node") or ""
    if attached:
        return str(attached).rsplit(".", 1)[-1]
    refs = props.get("refs") or []
    first = refs[0] if refs else {}
    return str(first.get("name", "") if isinstance(first, Mapping) else (first[0] if first else ""))


def _generic_sentence(name: str, kwargs: Mapping[str, Any], column: str, model: str) -> str:
    arguments = kwargs.get("arguments") if isinstance(kwargs.get("arguments"), Mapping) else kwargs
    where = f"{model}.{column}" if column else model
    if name == "not_null":
        return f"{where} is never null."
    if name == "unique":
        return f"{where} is unique: no value appears twice."
    if name == "accepted_values":
        values = arguments.get("values") or kwargs.get("values") or []
        return f"{where} only takes the values {', '.join(str(v) for v in values)}."
    if name == "relationships":
        to = str(arguments.get("to") or kwargs.get("to") or "")
        target = re.sub(r"ref\(['\"]([^'\"]+)['\"]\)", r"\1", to)
        return f"every {where} exists in {target}.{arguments.get('field') or kwargs.get('field')}."
    return f"dbt test {name} on {where}."


def _leading_comment(sql: str) -> str:
    lines: list[str] = []
    for line in sql.splitlines():
        text = line.strip()
        if text.startswith("{{") and not lines:  # a config() block before the comment
            continue
        if not text.startswith("--"):
            if lines:
                break
            continue
        lines.append(text.removeprefix("--").strip())
    return " ".join(lines).strip()


def row_counts(store: Warehouse, relations: Iterable[str]) -> dict[str, int]:
    """Rows in each named table or view of the warehouse (names that are not identifiers,
    or relations that do not exist, are left out)."""
    wanted = sorted({r for r in relations if _NAME.match(r)})
    if not wanted:
        return {}
    return billing_readers.relation_row_counts(store, wanted)
