"""``pipeline.toml`` validation: every bad value is named before Spark starts (no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.errors import ConfigError
from tidemark.pipeline.config import load_config

_GOOD = """
[source]
slot = "s1"
maxChangesPerTrigger = 100

[spark]
checkpoint = "chk"
trigger_interval_ms = 500

[targets."public.orders"]
path = "lake/orders"
keys = ["id"]
stored_as_scd_type = 2
"""

_ENV = {"TIDEMARK_DSN": "host=db dbname=app password=secret"}


def _load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> object:
    file = tmp_path / "pipeline.toml"
    file.write_text(text)
    return load_config(file, environ=_ENV if environ is None else environ)


def _error(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text, environ)
    return info.value


def test_a_good_file_resolves_paths_and_the_dsn_from_the_environment(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, _GOOD), environ=_ENV)
    assert config.dsn == _ENV["TIDEMARK_DSN"]
    assert "secret" not in repr(config)
    assert config.tables == ("public.orders",)
    assert config.checkpoint == str(tmp_path / "chk") and Path(config.checkpoint).is_dir()
    (target,) = config.targets
    assert target.path == str(tmp_path / "lake/orders")
    assert target.spec.keys == ("id",) and target.spec.stored_as_scd_type == 2
    assert config.source.max_changes_per_trigger == 100
    assert config.with_available_now().spark.available_now


def _write(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "pipeline.toml"
    file.write_text(text)
    return file


@pytest.mark.parametrize(("text", "key", "says"), [
    ("[source\nslot = 1", "config", "line 1"),
    (_GOOD + "\n[sink]\n", "sink", "allowed settings are: changelog, source, spark, targets"),
    (_GOOD.replace("slot =", "slott ="), "source.slott", "maxChangesPerTrigger"),
    (_GOOD.replace("maxChangesPerTrigger = 100", "maxChangesPerTrigger = 0"),
     "source.maxChangesPerTrigger", ">= 1"),
    (_GOOD.replace('checkpoint = "chk"\n', ""), "spark.checkpoint", "required"),
    (_GOOD.replace("trigger_interval_ms = 500", "trigger_interval_ms = 500\navailable_now = true"),
     "spark.trigger_interval_ms", "not both"),
    (_GOOD.replace("stored_as_scd_type = 2", "stored_as_scd_type = 3"),
     'targets."public.orders".stored_as_scd_type', "1 or 2"),
    (_GOOD.replace('keys = ["id"]', 'keys = "id"'), 'targets."public.orders".keys',
     "list of column names"),
    (_GOOD.replace('keys = ["id"]', 'keys = ["id"]\nsequence = ["x"]'),
     'targets."public.orders".sequence', "sequence_by"),
    (_GOOD.replace('path = "lake/orders"\n', ""), 'targets."public.orders".path',
     "required"),
    (_GOOD.replace('[targets."public.orders"]', '[targets."orders"]'), 'targets."orders"',
     "schema.table"),
    (_GOOD.replace('slot = "s1"', 'slot = "s1"\ntables = ["public.customers"]'),
     'targets."public.orders"', "not captured"),
    (_GOOD.replace('[spark]', '[changelog]\npath = "s3://bucket/x"\n\n[spark]'),
     "changelog.path", "local paths"),
])
def test_each_bad_value_is_named(tmp_path: Path, text: str, key: str, says: str) -> None:
    err = _error(tmp_path, text)
    assert err.key == key, str(err)
    assert says in str(err), str(err)


def test_a_missing_dsn_names_the_environment_variable(tmp_path: Path) -> None:
    err = _error(tmp_path, _GOOD.replace('slot = "s1"', 'dsn_env = "SHOP_DSN"'), environ={})
    assert err.key == "source.dsn" and "SHOP_DSN" in str(err)


def test_a_checkpoint_that_cannot_be_created_is_named(tmp_path: Path) -> None:
    # A regular file where a directory must go: creating it fails even for root (CI runs
    # as root, which a read-only directory would not stop).
    (tmp_path / "taken").write_text("not a directory")
    err = _error(tmp_path, _GOOD.replace('"chk"', '"taken/chk"'))
    assert err.key == "spark.checkpoint"
