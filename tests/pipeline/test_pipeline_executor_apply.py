"""``tidemark run`` with ``spark.apply_on = "executors"``: batches merged into Delta by
Spark tasks, a big batch of a big target split by key ranges into parts that the driver
commits as one (:mod:`tidemark.pipeline.executor_apply`)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from conftest import Database
from pipeline_helpers import (
    _assert_equal_to_source,
    _batch_lines,
    _pipeline_file,
    _prepare,
    _tidemark_run,
    check_a_snapshot_and_an_empty_table_s_snapshot,
)
from tidemark.lake.branch import BRANCHES_DIR
from tidemark.pipeline import load_config
from tidemark.pipeline.progress import BatchReport
from tidemark.pipeline.runner import Pipeline

# Every batch split into two parts where the targets' files allow it.
_EXECUTORS = ('master = "local[2]"\navailable_now = true\napply_on = "executors"\n'
              'apply_parts = 2\napply_part_mb = 0\n'
              'conf = { "spark.ui.enabled" = "false", "spark.sql.shuffle.partitions" = "2" }')


def _setup(db: Database, tmp_path: Path, *, changelog: bool = False,
           storage_options: bool = False) -> Path:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
               "CREATE TABLE b (id int PRIMARY KEY, v text)")
    source = _prepare(db, "a", "b") + f'dsn = "{db.dsn}"\nmaxChangesPerTrigger = 1000\n'
    file = _pipeline_file(tmp_path, source, _EXECUTORS, changelog=changelog)
    if storage_options:  # a target given as a URI, with delta-rs' storage options
        file.write_text(file.read_text().replace(
            'path = "lake/a"', f'path = "file://{tmp_path}/lake/a"\n'
                               'storage_options = { timeout = "120s" }'))
    with file.open("a") as out:  # no upkeep commits: every Delta version is a batch
        out.write("\n[upkeep]\nenabled = false\n")
    return file


def _three_batches(db: Database) -> None:
    """Two batches of inserts (two files of disjoint key ranges in each target), then one
    of updates and deletes all over both ranges, which is split in two parts."""
    db.execute("INSERT INTO a SELECT g, 'x' || g, g / 4.0 FROM generate_series(1, 1000) g",
               "INSERT INTO b SELECT g, 'first' FROM generate_series(1, 1000) g")
    db.execute("INSERT INTO a SELECT g, 'y' || g, g / 8.0 FROM generate_series(1001, 1800) g",
               "INSERT INTO b SELECT g, 'first' FROM generate_series(1001, 1800) g")
    db.execute("UPDATE a SET v = 'updated', n = n + 1 WHERE id % 7 = 0",
               "DELETE FROM a WHERE id % 11 = 0",
               "UPDATE b SET v = 'second' WHERE id % 5 = 0",
               "DELETE FROM b WHERE id % 13 = 0",
               "INSERT INTO a VALUES (5000, 'new', 1)")


def test_split_batches_are_one_commit_per_target_and_equal_the_source(
        spark: SparkSession, db: Database, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    config = _setup(db, tmp_path)
    _three_batches(db)
    reports: list[BatchReport] = []
    with caplog.at_level(logging.DEBUG, logger="tidemark.pipeline"):
        Pipeline(load_config(config), spark=spark, on_batch=reports.append).run()
    _assert_equal_to_source(db, tmp_path)
    split = [r.getMessage() for r in caplog.records if "in 2 parts" in r.getMessage()]
    assert any("public.a in 2 parts, public.b in 2 parts" in m for m in split), split
    for name in "ab":
        table = DeltaTable(str(tmp_path / "lake" / name))
        batches = [r for r in reports if r.changes.get(f"public.{name}")]
        # Version 0 creates the table; every batch after it is one commit.
        assert table.version() == len(batches), (name, table.version(), len(batches))
        operations = [c["operation"] for c in table.history()]
        assert "WRITE" in operations, f"{name}: no batch was published from parts"
        assert not (tmp_path / "lake" / name / BRANCHES_DIR).exists()


def test_a_truncate_in_a_split_batch_is_applied_whole(
        spark: SparkSession, db: Database, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    config = _setup(db, tmp_path, storage_options=True)
    assert load_config(config).targets[0].storage_options == {"timeout": "120s"}
    db.execute("INSERT INTO a SELECT g, 'x' || g, 1 FROM generate_series(1, 1000) g",
               "INSERT INTO b SELECT g, 'first' FROM generate_series(1, 10) g")
    db.execute("INSERT INTO a SELECT g, 'y' || g, 2 FROM generate_series(1001, 1800) g")
    db.execute("UPDATE a SET v = 'before' WHERE id % 3 = 0", "TRUNCATE a",
               "INSERT INTO a VALUES (7, 'after', 3), (1500, 'after', 4)")
    with caplog.at_level(logging.DEBUG, logger="tidemark"):
        Pipeline(load_config(config), spark=spark).run()
    _assert_equal_to_source(db, tmp_path)
    assert any("public.a: applying batch 2 as one part, not 2 (the batch holds a truncate"
               in r.getMessage() for r in caplog.records), caplog.text
    assert not (tmp_path / "lake/a" / BRANCHES_DIR).exists(), "the parts' branches stayed"


def test_sigkill_of_the_driver_while_executors_apply_loses_and_doubles_nothing(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    """The driver dies after batch 2 is in both targets (split), before Spark commits it;
    the restart finds it there (app transaction) and skips it."""
    config = _setup(db, tmp_path)
    _three_batches(db)
    log = tmp_path / "run.log"
    proc = _tidemark_run(config, log, extra_env={"TIDEMARK_FAULT": "after_write:2"})
    assert proc.wait(180) == -signal.SIGKILL, log.read_text(errors="replace")[-3000:]
    lines = _batch_lines(log)
    assert [line.split(":")[0] for line in lines] == ["batch 0", "batch 1"], lines
    reports: list[BatchReport] = []
    Pipeline(load_config(config), spark=spark, on_batch=reports.append).run()
    assert reports[0].batch_id == 2 and set(reports[0].replayed) == {"public.a", "public.b"}
    _assert_equal_to_source(db, tmp_path)


def test_snapshots_and_an_empty_table_s_snapshot_on_the_executors(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    """Snapshot chunks are loaded by the tasks (replace, then append), and an empty
    table's snapshot, which no task has rows for, still creates its target."""
    check_a_snapshot_and_an_empty_table_s_snapshot(spark, db, tmp_path, _EXECUTORS)
