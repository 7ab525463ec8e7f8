"""``tidemark run`` after schema and key changes in the source: Delta ends equal to it.

Every DDL here is committed before the run, so a batch holds changes made under an
older layout of the table (``maxChangesPerTrigger = 2`` cuts several batches).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from conftest import Database
from pipeline_helpers import _pipeline_file, _prepare
from tidemark.pipeline import load_config
from tidemark.pipeline.compare import compare
from tidemark.pipeline.runner import Pipeline, PipelineError

pytestmark = pytest.mark.integration


def _assert_equal(db: Database, tmp_path: Path, columns: list[str]) -> None:
    source, lake = compare(db.dsn, "public.a", str(tmp_path / "lake/a"), columns)
    assert source == lake
    source, lake = compare(db.dsn, "public.b", str(tmp_path / "lake/b"), columns, scd2=True)
    assert source == lake


def test_a_default_column_a_toasted_key_change_and_a_wider_type_reach_delta(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    tables = ("a", "b")
    for t in tables:
        db.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int, big text)",
                   f"ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL")
    source = _prepare(db, *tables) + f'dsn = "{db.dsn}"\nmaxChangesPerTrigger = 2\n'
    config = load_config(_pipeline_file(tmp_path, source, "available_now = true",
                                        changelog=False))
    for t in tables:
        db.execute(f"INSERT INTO {t} SELECT g, g, repeat('big' || g, 5000) "
                   "FROM generate_series(1, 4) g")
    Pipeline(config, spark=spark).run()

    for t in tables:
        # id 1 changes before c2 exists; the batch that applies it adds c2, whose
        # DEFAULT the target's existing rows get: id 1 must keep it too.
        db.execute(f"ALTER TABLE {t} ADD COLUMN c1 int",
                   f"UPDATE {t} SET c1 = 5 WHERE id = 1",
                   f"ALTER TABLE {t} ADD COLUMN c2 text DEFAULT 'dflt'",
                   f"UPDATE {t} SET v = v + 1 WHERE id = 2",
                   # big is not sent (unchanged TOAST): it lives under the old key.
                   f"UPDATE {t} SET id = 30 WHERE id = 3",
                   f"UPDATE {t} SET id = 50, v = 0 WHERE id = 4")
    Pipeline(config, spark=spark).run()
    columns = ["id", "v", "big", "c1", "c2"]
    _assert_equal(db, tmp_path, columns)
    lake = compare(db.dsn, "public.a", str(tmp_path / "lake/a"), columns)[1]
    assert [(r[0], r[3], r[4]) for r in lake] == [
        (1, 5, "dflt"), (2, None, "dflt"), (30, None, "dflt"), (50, None, "dflt")]
    assert all(r[2] for r in lake), "a moved row lost its TOASTed value"

    # A wider type: the target widens (one rewrite), and takes values beyond int.
    for t in tables:
        db.execute(f"ALTER TABLE {t} ALTER COLUMN v TYPE bigint",
                   f"UPDATE {t} SET v = 5000000000 WHERE id = 2")
    Pipeline(config, spark=spark).run()
    _assert_equal(db, tmp_path, columns)
    for t in tables:
        fields = {f.name: f.type.type for f in DeltaTable(str(tmp_path / "lake" / t))
                  .schema().fields}
        assert fields["v"] == "long"

    # A type Delta cannot widen to stops the run with one line naming it all.
    db.execute("ALTER TABLE a ALTER COLUMN v TYPE text", "UPDATE a SET v = 'x' WHERE id = 1")
    with pytest.raises(PipelineError) as stopped:
        Pipeline(config, spark=spark).run()
    message = str(stopped.value)
    assert "public.a" in message and "'v'" in message
    assert "long in Delta but string in the source" in message


def test_changes_made_before_a_rename_reach_the_renamed_column(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    tables = ("a", "b")
    for t in tables:
        db.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    source = _prepare(db, *tables) + f'dsn = "{db.dsn}"\nmaxChangesPerTrigger = 2\n'
    config = load_config(_pipeline_file(tmp_path, source, "available_now = true",
                                        changelog=False))
    for t in tables:
        db.execute(f"INSERT INTO {t} SELECT g, g FROM generate_series(1, 4) g")
    Pipeline(config, spark=spark).run()

    # All committed while the pipeline is stopped: the stream names c1 and x as they
    # were, the catalog knows c1r only (x dropped).
    for t in tables:
        db.execute(f"ALTER TABLE {t} ADD COLUMN c1 int",
                   f"UPDATE {t} SET c1 = id * 10 WHERE id <= 2",
                   f"ALTER TABLE {t} RENAME COLUMN c1 TO c1r",
                   f"UPDATE {t} SET v = v + 1 WHERE id = 3",
                   f"ALTER TABLE {t} ADD COLUMN x int",
                   f"UPDATE {t} SET x = 1, c1r = 40 WHERE id = 4",
                   f"ALTER TABLE {t} DROP COLUMN x")
    Pipeline(config, spark=spark).run()
    columns = ["id", "v", "c1r"]
    _assert_equal(db, tmp_path, columns)
    lake = compare(db.dsn, "public.a", str(tmp_path / "lake/a"), columns)[1]
    assert [r[2] for r in lake] == [10, 20, None, 40]


def test_a_column_dropped_and_another_added_before_their_changes_were_read_stops(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    tables = ("a", "b")
    for t in tables:
        db.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    source = _prepare(db, *tables) + f'dsn = "{db.dsn}"\n'
    config = load_config(_pipeline_file(tmp_path, source, "available_now = true",
                                        changelog=False))
    for t in tables:
        db.execute(f"INSERT INTO {t} SELECT g, g FROM generate_series(1, 2) g")
    Pipeline(config, spark=spark).run()

    # c1 dropped and c2 added, or c1 renamed to c2 after a column was dropped: the
    # stream's "c1" cannot be placed.
    for t in tables:
        db.execute(f"ALTER TABLE {t} ADD COLUMN c1 int",
                   f"UPDATE {t} SET c1 = 5 WHERE id = 1",
                   f"ALTER TABLE {t} DROP COLUMN c1",
                   f"ALTER TABLE {t} ADD COLUMN c2 int",
                   f"UPDATE {t} SET c2 = 7 WHERE id = 2")
    for _ in range(2):  # a restart does not make it go away, nor change what it says
        with pytest.raises(PipelineError) as stopped:
            Pipeline(config, spark=spark).run()
        message = str(stopped.value)
        assert "\n" not in message.strip()
        assert "public.a" in message and "c1" in message
        assert "restarting does not help" in message
        assert 'onSchemaChange = "drop_new_columns"' in message
        assert "execute-snapshot public.a" in message

    # The way out it names: the changes go on without c1 (which is gone anyway).
    config_file = tmp_path / "pipeline.toml"
    text = config_file.read_text().replace(
        "[source]\n", '[source]\nonSchemaChange = "drop_new_columns"\n')
    config_file.write_text(text)
    Pipeline(load_config(config_file), spark=spark).run()
    _assert_equal(db, tmp_path, ["id", "v", "c2"])
