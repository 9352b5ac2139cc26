from pathlib import Path

import pytest

from market_pipeline.config import DEFAULT_CONFIG_PATH, ConfigError, load_config


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "market.toml"
    path.write_text(text)
    return path


def test_shipped_defaults_validate_and_link_pools_to_catalog():
    config = load_config(DEFAULT_CONFIG_PATH, environ={})
    assert config.adapter.backend == "simulated"
    for pool in config.pools:
        assert pool.gpu_model in config.gpu_model_by_name
        assert pool.zone in config.zone_by_name
    assert config.pool_by_id["A100-80GB@cn-hangzhou-a"].gpus_per_node == 8


def test_unknown_key_is_reported_by_name(tmp_path):
    text = DEFAULT_CONFIG_PATH.read_text().replace("[warehouse]\n", "[warehouse]\nnot_a_key = 3\n", 1)
    with pytest.raises(ConfigError, match=r"warehouse\.not_a_key: unknown key"):
        load_config(_write(tmp_path, text), environ={})


def test_bad_value_names_key_and_problem(tmp_path):
    text = DEFAULT_CONFIG_PATH.read_text().replace("tick_minutes = 5", "tick_minutes = 0")
    with pytest.raises(ConfigError, match=r"loop\.tick_minutes: .*greater than or equal to 1"):
        load_config(_write(tmp_path, text), environ={})


def test_pool_referencing_unknown_model_is_rejected(tmp_path):
    text = DEFAULT_CONFIG_PATH.read_text().replace('gpu_model = "H800"', 'gpu_model = "B999"')
    with pytest.raises(ConfigError, match="unknown GPU model 'B999'"):
        load_config(_write(tmp_path, text), environ={})


def test_env_overrides_scalars_and_are_validated():
    config = load_config(
        DEFAULT_CONFIG_PATH,
        environ={
            "MP__LOOP__SHADOW_MODE": "true",
            "MP__WAREHOUSE__PATH": "/tmp/elsewhere.duckdb",
            "MP__GUARDRAILS__TASK_DRAIN__WARN_SECONDS": "45",
        },
    )
    assert config.loop.shadow_mode is True
    assert config.warehouse_path == Path("/tmp/elsewhere.duckdb")
    assert config.guardrails.task_drain.warn_seconds == 45.0
    with pytest.raises(ConfigError, match=r"market\.max_price_step"):
        load_config(DEFAULT_CONFIG_PATH, environ={"MP__MARKET__MAX_PRICE_STEP": "-1"})


def test_missing_and_malformed_files_give_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml", environ={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path, "[warehouse\npath = 1"), environ={})


def test_relative_paths_resolve_against_project_home(monkeypatch, tmp_path):
    monkeypatch.setenv("MARKET_PIPELINE_HOME", str(tmp_path))
    config = load_config(DEFAULT_CONFIG_PATH, environ={})
    assert config.warehouse_path == tmp_path / "var" / "warehouse.duckdb"
