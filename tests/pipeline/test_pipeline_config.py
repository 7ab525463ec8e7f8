"""``pipeline.toml`` validation: every bad value is named before Spark starts (no Spark)."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import tempfile
import tomllib
from pathlib import Path

import pytest

from tidemark.errors import ConfigError
from tidemark.pipeline.config import PipelineConfig, load_config, parse_config

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
    assert config.checkpoint == str(tmp_path / "chk")
    assert not Path(config.checkpoint).exists()  # made by the start, after its checks
    (target,) = config.targets
    assert target.path == str(tmp_path / "lake/orders")
    assert target.spec.keys == ("id",) and target.spec.stored_as_scd_type == 2
    assert config.source.max_changes_per_trigger == 100
    assert config.with_available_now().spark.available_now


def test_a_target_may_be_an_object_store_with_storage_options(tmp_path: Path) -> None:
    """An object store's URI is kept (delta-rs reaches it with the options, which
    ``repr`` leaves out: they may hold credentials); a ``file://`` URI is a local path."""
    text = _GOOD.replace('path = "lake/orders"', 'path = "s3://bucket/orders"\n'
                         'storage_options = { AWS_REGION = "eu-west-1", '
                         'AWS_SECRET_ACCESS_KEY = "hush" }')
    (target,) = load_config(_write(tmp_path, text), environ=_ENV).targets
    assert target.path == "s3://bucket/orders" and not target.local
    assert target.storage_options == {"AWS_REGION": "eu-west-1",
                                      "AWS_SECRET_ACCESS_KEY": "hush"}
    assert "hush" not in repr(target)
    local = _GOOD.replace('path = "lake/orders"', f'path = "file://{tmp_path}/lake/o"')
    (target,) = load_config(_write(tmp_path, local), environ=_ENV).targets
    assert target.path == str(tmp_path / "lake/o") and target.local


def test_upkeep_comes_from_its_section_and_each_target_may_change_it(
        tmp_path: Path) -> None:
    text = (_GOOD + '\n[targets."public.customers"]\npath = "lake/customers"\n'
            'keys = ["id"]\nupkeep = { compact_min_files = 0 }\n'
            "\n[upkeep]\ncheckpoint_every = 5\n")
    config = load_config(_write(tmp_path, text), environ=_ENV)
    orders, customers = config.targets
    assert orders.upkeep.checkpoint_every == customers.upkeep.checkpoint_every == 5
    assert orders.upkeep.compact_min_files == 16 and customers.upkeep.compact_min_files == 0
    assert config.spark.collect_max_mb == 64 and config.spark.apply_step_rows == 500_000


def _write(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "pipeline.toml"
    file.write_text(text)
    return file


@pytest.mark.parametrize(("text", "key", "says"), [
    ("[source\nslot = 1", "config", "line 1"),
    (_GOOD + "\n[sink]\n", "sink",
     "allowed settings are: changelog, metrics, source, spark, targets"),
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
    (_GOOD.replace('keys = ["id"]\n', ""), 'targets."public.orders".keys',
     "required: the key columns"),
    (_GOOD.replace('[targets."public.orders"]', '[targets."orders"]'), 'targets."orders"',
     "schema.table"),
    (_GOOD.replace('slot = "s1"', 'slot = "s1"\ntables = ["public.customers"]'),
     'targets."public.orders"', "not captured"),
    (_GOOD.replace('[spark]', '[changelog]\npath = "s3://bucket/x"\n\n[spark]'),
     "changelog.path", "local paths"),
    (_GOOD.replace('keys = ["id"]', 'keys = ["id"]\nsnapshot = "sometimes"'),
     'targets."public.orders".snapshot', "choose 'never' or 'initial'"),
    (_GOOD.replace('slot = "s1"', 'slot = "s1"\nsignal_table = "public.dbz signal"'),
     "source.signal_table", "schema.table"),
    (_GOOD.replace('slot = "s1"', 'slot = "s1"\nsnapshotChunkRows = 0'),
     "source.snapshotChunkRows", ">= 1"),
    (_GOOD.replace("trigger_interval_ms = 500", "collect_max_mb = -1"),
     "spark.collect_max_mb", ">= 0"),
    (_GOOD + "\n[upkeep]\ncompact_min_files = -1\n", "upkeep.compact_min_files", ">= 0"),
    (_GOOD.replace('keys = ["id"]', 'keys = ["id"]\nstorage_options = { AWS_MAX_RETRIES = 3 }'),
     'targets."public.orders".storage_options', "table of strings"),
    (_GOOD.replace("trigger_interval_ms = 500", 'apply_on = "workers"'),
     "spark.apply_on", "driver"),
    (_GOOD.replace("trigger_interval_ms = 500", "apply_parts = 0"),
     "spark.apply_parts", ">= 1"),
    (_GOOD + "\n[upkeep]\nvacum = 1\n", "upkeep.vacum", "vacuum_every_minutes"),
    (_GOOD.replace('keys = ["id"]', 'keys = ["id"]\nupkeep = { target_file_mb = 0 }'),
     'targets."public.orders".upkeep.target_file_mb', ">= 1"),
    (_GOOD.replace('keys = ["id"]', 'keys = ["id"]\nmerge = "on_read"'),
     'targets."public.orders".merge', "auto, copy_on_write, merge_on_read"),
    (_GOOD + "\n[upkeep]\ncompact_deleted_fraction = 1.5\n",
     "upkeep.compact_deleted_fraction", "<= 1"),
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


@pytest.mark.parametrize("kind", ["directory of other files", "file"])
def test_a_target_path_that_is_not_a_delta_table_is_named(tmp_path: Path, kind: str) -> None:
    # Found here, before Spark starts: the source is never read for a batch that cannot
    # be applied.
    target = tmp_path / "lake/orders"
    target.parent.mkdir()
    if kind == "file":
        target.write_text("id,amount\n")
    else:
        target.mkdir()
        (target / "orders.csv").write_text("id,amount\n")
    err = _error(tmp_path, _GOOD)
    assert err.key == 'targets."public.orders".path'
    assert f"{target} " in str(err) and "not a Delta table" in str(err), str(err)
    assert "expected a Delta table's directory, or a new or empty directory" in str(err)


def test_a_checkpoint_directory_without_write_permission_is_named(tmp_path: Path) -> None:
    # Root writes anywhere and CI runs as root, so the check runs in a forked child
    # demoted to an unprivileged user, like a pipeline started by an ordinary user.
    # pytest's tmp_path lies under a directory only its owner may enter: use /tmp.
    base = Path(tempfile.mkdtemp(prefix="tidemark-perm-"))
    try:
        base.chmod(0o755)
        (base / "chk").mkdir(mode=0o555)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: demote, validate, report, exit without cleanup
            try:
                os.close(read)
                if os.geteuid() == 0:
                    nobody = pwd.getpwnam("nobody")
                    os.setgroups([])
                    os.setgid(nobody.pw_gid)
                    os.setuid(nobody.pw_uid)
                try:
                    parse_config(tomllib.loads(_GOOD), base=base, environ=_ENV)
                    outcome = "no error"
                except ConfigError as err:
                    outcome = f"{err.key}\n{err}"
                os.write(write, outcome.encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            outcome = pipe.read().decode()
        os.waitpid(pid, 0)
    finally:
        shutil.rmtree(base)
    key, _, message = outcome.partition("\n")
    assert key == "spark.checkpoint", outcome
    assert f"{base / 'chk'} is not a writable directory" in message


@pytest.mark.parametrize(("paths", "key", "message"), [
    ({"orders": "lake/t", "customers": "lake/t"}, 'targets."public.customers".path',
     r'is also targets\."public\.orders"\.path'),
    ({"orders": "lake/t", "customers": "lake/t/inner"}, 'targets."public.customers".path',
     "are nested"),
    ({"orders": "chk", "customers": "lake/c"}, "spark.checkpoint", "is also targets"),
    ({"orders": "chk/orders", "customers": "lake/c"}, "spark.checkpoint", "are nested"),
    ({"orders": "lake", "customers": "lake/c"}, 'targets."public.customers".path', "nested"),
])
def test_targets_checkpoint_and_changelog_need_their_own_directories(
        tmp_path: Path, paths: dict[str, str], key: str, message: str) -> None:
    text = f"""
[spark]
checkpoint = "chk"
[targets."public.orders"]
path = "{paths['orders']}"
keys = ["id"]
[targets."public.customers"]
path = "{paths['customers']}"
keys = ["id"]
"""
    err = _error(tmp_path, text)
    assert err.key == key
    assert re.search(message, str(err)), str(err)
    assert not (tmp_path / "chk").exists()  # refused before anything was created


def test_the_changelog_may_not_share_a_target_s_directory(tmp_path: Path) -> None:
    err = _error(tmp_path, _GOOD + '\n[changelog]\npath = "lake/orders/_changes"\n')
    assert err.key == "changelog.path" and "nested" in str(err)


def test_on_schema_change_is_a_source_setting(tmp_path: Path) -> None:
    config = _load(tmp_path, _GOOD.replace('slot = "s1"',
                                           'slot = "s1"\nonSchemaChange = "drop_new_columns"'))
    assert config.source.on_schema_change.value == "drop_new_columns"  # type: ignore[attr-defined]
    err = _error(tmp_path, _GOOD.replace('slot = "s1"', 'slot = "s1"\nonSchemaChange = "x"'))
    assert err.key == "source.onSchemaChange" and "drop_new_columns" in str(err), str(err)


_TARGET = '[spark]\ncheckpoint = "chk"\n[targets."public.orders"]\npath = "lake/o"\nkeys = ["id"]\n'
_SQLITE = 'dsn = "sqlite:///app.db"'
_MARIADB = 'dsn = "mariadb://cdc@db:3306/shop"'
_LOGTABLE = 'dsn = "host=db dbname=app"\nkind = "logtable"'
_POSTGRES = 'dsn = "host=db dbname=app"'


@pytest.mark.parametrize(("source", "line", "says"), [
    (_SQLITE, 'slot = "other"', "does not apply to log tables"),
    (_LOGTABLE, 'slot = "other"', "does not apply to log tables"),
    (_MARIADB, 'slot = "other"', "applies to PostgreSQL replication only"),
    (_POSTGRES, "retention_s = 60", "applies to log tables only"),
    (_MARIADB, "retention_s = 60", "applies to log tables only"),
    (_MARIADB, 'publication = "p"', "applies to PostgreSQL replication only"),
    (_MARIADB, "slotFailover = true", "applies to PostgreSQL replication only"),
    (_MARIADB, "snapshotChunkRows = 10", "applies to PostgreSQL replication only"),
    (_MARIADB, "serverTimeoutMs = 1000", "applies to PostgreSQL replication only"),
    (_SQLITE, 'publication = "p"', "does not apply to log tables"),
    (_LOGTABLE, "maxChangesPerTrigger = 5", "does not apply to log tables"),
    (_LOGTABLE, "snapshotChunksPerTrigger = 5", "does not apply to log tables"),
    (_SQLITE, "serverTimeoutMs = 1000", "does not apply to log tables"),
])
def test_a_source_setting_the_source_would_ignore_is_refused(
        tmp_path: Path, source: str, line: str, says: str) -> None:
    """Refused by the kind's list of the Spark options it refuses, before the checkpoint
    is made (the runner would ignore the setting, or the Spark source refuse it late)."""
    err = _error(tmp_path, f"[source]\n{source}\n{line}\n{_TARGET}")
    key = line.split(maxsplit=1)[0]
    assert err.key == f"source.{key}", str(err)
    assert says in str(err) and f"leave {key} out of [source]" in str(err), str(err)
    assert "is read as" in str(err)  # the source
    assert not (tmp_path / "chk").exists()


@pytest.mark.parametrize(("source", "line"), [
    (_SQLITE, "retention_s = 60"), (_LOGTABLE, "retention_s = -1"),
    (_MARIADB, "maxChangesPerTrigger = 5"), (_MARIADB, 'signal_table = "shop.sig"'),
    (_SQLITE, 'signal_table = "main.sig"'), (_LOGTABLE, 'signal_table = "public.sig"'),
    (_POSTGRES, 'slot = "other"'), (_POSTGRES, "snapshotChunkRows = 10"),
])
def test_a_source_setting_the_source_reads_is_taken(
        tmp_path: Path, source: str, line: str) -> None:
    _load(tmp_path, f"[source]\n{source}\n{line}\n{_TARGET}")


@pytest.mark.parametrize("merge", ["merge_on_read", "auto", "copy_on_write"])
def test_a_target_chooses_its_merge(tmp_path: Path, merge: str) -> None:
    config = _load(tmp_path, _GOOD.replace('keys = ["id"]', f'keys = ["id"]\nmerge = "{merge}"'))
    assert isinstance(config, PipelineConfig)
    (target,) = config.targets
    assert target.spec.merge == merge
