"""Hypothesis over the CLI's inputs: config, instance JSON, telemetry files, quote and balance
arguments. Whatever the input: exit 0 (accepted) or a clear refusal (one line, status 2),
never a traceback or an internal error (70), and a refused command leaves the warehouse's
checksum as it was. The ledger is never rewritten.
"""

from __future__ import annotations

import json
import math
import os
import re
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
from hardening_kit import TENANT, build_warehouse, checksum, clear_refusal, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from market_pipeline.config import DEFAULT_CONFIG_PATH, load_config

# HARDENING_FUZZ_EXAMPLES=500 runs a deeper, random search; the default is a fixed quick one
DEEP = int(os.environ.get("HARDENING_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=DEEP or 20,
    deadline=None,
    derandomize=not DEEP,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
DEFAULTS = DEFAULT_CONFIG_PATH.read_text()
NUMERIC_LINE = re.compile(r"(?m)^(\w+) = (-?[0-9][0-9_.eE+-]*)$")
NUMERIC_KEYS = [m.start() for m in NUMERIC_LINE.finditer(DEFAULTS)]
POOL = load_config().pools[0].pool_id

numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**15), 10**15))
junk_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.integers(), junk_text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(junk_text, inner, max_size=4)),
    max_leaves=20,
)
TINY_INSTANCE = {
    "resources": [{"name": "gpu", "capacity": 8.0, "unit_cost": 0.5, "price_min": 0.1, "price_max": 10.0}],
    "tenants": [{"id": "t", "utility": "log", "weight": [1.0], "saturation": [1.0], "budget": 5.0}],
}


def _toml_value(value: object) -> str:
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    return str(value) if isinstance(value, int) else json.dumps(value)


def _assert_outcome(code: int, err: str, accepted: tuple[int, ...] = (0,)) -> bool:
    """True when the command refused; fails the test on a traceback or an unclear refusal."""
    assert "Traceback" not in err and code != 70, err
    if code in accepted:
        return False
    assert clear_refusal(code, err), (code, err)
    return True


def _all_finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_all_finite(v) for v in value)
    return True


@FUZZ
@given(key=st.sampled_from(NUMERIC_KEYS), value=st.one_of(numbers, junk_text))
def test_hardening_fuzz_config_numbers(tmp_path: Path, key: int, value: object) -> None:
    line = NUMERIC_LINE.match(DEFAULTS, key)
    text = DEFAULTS[:key] + f"{line.group(1)} = {_toml_value(value)}" + DEFAULTS[line.end() :]
    path = tmp_path / "fuzz.toml"
    path.write_text(text)
    code, out, err = run_cli("config", "--file", str(path))
    if not _assert_outcome(code, err):
        assert _all_finite(json.loads(out))  # an accepted config holds no inf or nan


@FUZZ
@given(data=st.binary(max_size=300))
def test_hardening_fuzz_config_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.toml"
    path.write_bytes(data)
    _assert_outcome(*run_cli("config", "--file", str(path))[::2])


@FUZZ
@given(
    where=st.sampled_from(["root", "resource", "tenant"]),
    key=junk_text
    | st.sampled_from(
        ["capacity", "unit_cost", "price_min", "price_max", "weight", "saturation", "budget", "name", "id"]
    ),
    value=json_values,
)
def test_hardening_fuzz_instance_json(tmp_path: Path, where: str, key: str, value: object) -> None:
    data = json.loads(json.dumps(TINY_INSTANCE))
    target = {"root": data, "resource": data["resources"][0], "tenant": data["tenants"][0]}[where]
    target[key] = value
    path = tmp_path / "instance.json"
    path.write_text(json.dumps(data))
    code, out, err = run_cli("solve", "--instance", str(path), "--json")
    if not _assert_outcome(code, err, accepted=(0, 1)):
        assert json.loads(out)["status"]  # strict JSON with the status, fallback or not


@FUZZ
@given(value=json_values)
def test_hardening_fuzz_instance_any_json(tmp_path: Path, value: object) -> None:
    path = tmp_path / "instance.json"
    path.write_text(json.dumps(value))
    _assert_outcome(*run_cli("solve", "--instance", str(path), "--json")[::2], accepted=())


@pytest.fixture(scope="module")
def fuzz_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_warehouse(tmp_path_factory.mktemp("fuzz") / "warehouse.duckdb")


TELEMETRY_HEADER = "ts,node_id,gpu_uuid,gpu_index,sm_util_pct,mem_used_mib,mem_total_mib,power_w,temp_c"


@FUZZ
@given(
    suffix=st.sampled_from([".csv", ".parquet", ".txt", ".tsv", ""]),
    body=st.one_of(
        st.binary(max_size=400),
        st.lists(st.lists(junk_text, min_size=9, max_size=9), max_size=5).map(
            lambda rows: (
                TELEMETRY_HEADER + "\n" + "\n".join(",".join(json.dumps(c) for c in r) for r in rows)
            ).encode()
        ),
    ),
)
def test_hardening_fuzz_telemetry_files(
    fuzz_warehouse: Path, tmp_path: Path, suffix: str, body: bytes
) -> None:
    path = tmp_path / f"samples{suffix}"
    path.write_bytes(body)
    before = checksum(fuzz_warehouse)
    code, _, err = run_cli("telemetry", "ingest", "--file", str(path), "--warehouse", str(fuzz_warehouse))
    if _assert_outcome(code, err):
        assert checksum(fuzz_warehouse) == before


@FUZZ
@given(
    gpus=junk_text | numbers.map(str),
    hours=junk_text | numbers.map(str),
    start=st.none() | junk_text | st.datetimes().map(lambda d: d.isoformat()),
)
def test_hardening_fuzz_quote_arguments(tmp_path: Path, gpus: str, hours: str, start: str | None) -> None:
    argv = [
        "quote",
        "--tenant",
        TENANT,
        "--pool",
        POOL,
        f"--gpus={gpus}",
        f"--hours={hours}",
        "--warehouse",
        str(tmp_path / "none.duckdb"),
        "--json",
    ]
    if start is not None:
        argv.append(f"--start={start}")
    code, out, err = run_cli(*argv)
    if not _assert_outcome(code, err):
        assert _all_finite(json.loads(out))


def _ledger(path: Path) -> dict[str, Decimal]:
    with duckdb.connect(str(path), read_only=True) as con:
        return dict(con.execute("SELECT entry_id, amount FROM billing_ledger").fetchall())


@FUZZ
@given(
    amount=junk_text | numbers.map(str),
    reference=st.sampled_from(["r1", "r2", "r3"]) | junk_text,
    limit=st.none() | junk_text | numbers.map(str),
    tenant=st.sampled_from([TENANT, "nobody", ""]),
)
def test_hardening_fuzz_balance_arguments(
    fuzz_warehouse: Path, amount: str, reference: str, limit: str | None, tenant: str
) -> None:
    booked = _ledger(fuzz_warehouse)
    before = checksum(fuzz_warehouse)
    argv = [
        "balance",
        f"--tenant={tenant}",
        f"--top-up={amount}",
        f"--reference={reference}",
        "--warehouse",
        str(fuzz_warehouse),
    ]
    if limit is not None:
        argv.append(f"--credit-limit={limit}")
    code, _, err = run_cli(*argv)
    if _assert_outcome(code, err):
        assert checksum(fuzz_warehouse) == before
    after = _ledger(fuzz_warehouse)
    assert all(after[k] == v for k, v in booked.items())  # nothing booked is ever rewritten
